"""What nvitop's Python API (nvitop.Device) reports, as one JSON object on stdout."""

import json
import sys

from nvitop import Device


def main():
    devices = []
    for d in Device.all():
        procs = d.processes()
        devices.append(
            {
                "index": d.index,
                "memory_total": d.memory_total(),
                "memory_used": d.memory_used(),
                "memory_free": d.memory_free(),
                "processes": sorted([[pid, p.gpu_memory()] for pid, p in procs.items()]),
            }
        )
    json.dump({"devices": devices}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
