"""NVML's event API through pynvml (a real client), driven line by line from stdin so that a
test can post events and lose GPUs between the steps (tests/integration/nvml_events.rs).

It makes one event set, registers every GPU for XID errors (and GPU 1, when there is one,
for double-bit ECC errors too), then answers each command with one JSON line:

  wait MS       nvmlEventSetWait(set, MS): the event (GPU index, type, data, instance IDs)
                or the error's name, and the seconds the call took
  query N       nvmlDeviceGetHandleByIndex(N) and nvmlDeviceGetMemoryInfo on it: "ok" or
                the error's name for each
  register N T  nvmlDeviceRegisterEvents(handle N, T): "ok" or the error's name
  free          nvmlEventSetFree(set)
"""

import json
import sys
import time

import pynvml


def error_name(e):
    return type(e).__name__


def main():
    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    supported = [pynvml.nvmlDeviceGetSupportedEventTypes(h) for h in handles]
    event_set = pynvml.nvmlEventSetCreate()
    for i, h in enumerate(handles):
        types = pynvml.nvmlEventTypeXidCriticalError
        if i == 1:
            types |= pynvml.nvmlEventTypeDoubleBitEccError
        pynvml.nvmlDeviceRegisterEvents(h, types, event_set)
    print(json.dumps({"ready": True, "count": count, "supported": supported}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        answer = {"command": words[0]}
        if words[0] == "wait":
            t0 = time.monotonic()
            try:
                e = pynvml.nvmlEventSetWait(event_set, int(words[1]))
                answer.update(
                    {
                        "gpu": pynvml.nvmlDeviceGetIndex(e.device),
                        "type": e.eventType,
                        "data": e.eventData,
                        "gpuInstanceId": e.gpuInstanceId,
                        "computeInstanceId": e.computeInstanceId,
                    }
                )
            except pynvml.NVMLError as e:
                answer["error"] = error_name(e)
            answer["seconds"] = time.monotonic() - t0
        elif words[0] == "query":
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(int(words[1]))
                answer["handle"] = "ok"
            except pynvml.NVMLError as e:
                answer["handle"] = error_name(e)
                h = handles[int(words[1])]
            try:
                pynvml.nvmlDeviceGetMemoryInfo(h)
                answer["memory"] = "ok"
            except pynvml.NVMLError as e:
                answer["memory"] = error_name(e)
        elif words[0] == "register":
            try:
                pynvml.nvmlDeviceRegisterEvents(handles[int(words[1])], int(words[2], 0), event_set)
                answer["result"] = "ok"
            except pynvml.NVMLError as e:
                answer["result"] = error_name(e)
        elif words[0] == "free":
            pynvml.nvmlEventSetFree(event_set)
            answer["result"] = "ok"
        print(json.dumps(answer), flush=True)
    pynvml.nvmlShutdown()


if __name__ == "__main__":
    main()
