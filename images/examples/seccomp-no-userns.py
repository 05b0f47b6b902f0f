#!/usr/bin/env python3
"""Write podman's default seccomp profile with new user namespaces refused.

A process that may create a user namespace becomes root in it and may mount over
/etc/ld.so.preload there, for itself and its children: a way around a preloaded cap
(docs/security.md). Docker's default profile refuses this to containers without
CAP_SYS_ADMIN; podman's allows it. This profile is podman's, with clone(2) and unshare(2)
allowed only without CLONE_NEWUSER, and clone3(2), whose flags seccomp cannot read,
answered with ENOSYS, so that the C library falls back to clone(2).

    python3 seccomp-no-userns.py > /etc/containers/seccomp-no-userns.json
    podman run --security-opt seccomp=/etc/containers/seccomp-no-userns.json \\
        --device nvidia.com/gpu=0 --device fgpu.io/gpu=0-8g IMAGE

Reads /usr/share/containers/seccomp.json, or the profile named as the first argument.
The flags are clone's first argument on x86_64 and aarch64 (s390x passes them second).
"""
import json
import sys

CLONE_NEWUSER = 0x10000000
ENOSYS = 38
GATED = ("clone", "clone3", "unshare")


def without_userns(profile):
    rules = []
    for rule in profile["syscalls"]:
        # Take the three calls out of the unconditional rules that allow them.
        if rule.get("action") == "SCMP_ACT_ALLOW" and not rule.get("args") and not rule.get("includes"):
            rule = dict(rule, names=[n for n in rule["names"] if n not in GATED])
            if not rule["names"]:
                continue
        rules.append(rule)
    no_newuser = [{"index": 0, "value": CLONE_NEWUSER, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]
    rules.append({"names": ["clone", "unshare"], "action": "SCMP_ACT_ALLOW", "args": no_newuser})
    rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS})
    return dict(profile, syscalls=rules)


def main():
    source = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/containers/seccomp.json"
    with open(source) as f:
        profile = json.load(f)
    json.dump(without_userns(profile), sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
