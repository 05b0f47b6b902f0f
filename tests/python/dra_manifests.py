"""Checks deploy/kubernetes's manifests for what docs/kubernetes.md says of them, and
evaluates the ValidatingAdmissionPolicy's CEL (with cel-python) on the admission requests the
API server would make of it, since no API server runs here.

  dra_manifests.py fgpu-dra-driver.yaml claim-template.yaml deployment.yaml   -> prints ok
"""

import sys

import celpy
import yaml


def documents(paths):
    docs = {}
    for path in paths:
        with open(path) as f:
            for d in yaml.safe_load_all(f):
                if d:
                    docs[(d["kind"], d["metadata"]["name"])] = d
    return docs


def evaluate(expression, activation):
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    return program.evaluate(activation)


def admission(policy, username, node_name, operation, obj, old):
    """What the policy says of one request: None when it does not apply, else the list of
    messages of the validations that failed (empty: admitted)."""
    extra = {} if node_name is None else {"authentication.kubernetes.io/node-name": [node_name]}
    request = {"operation": operation, "userInfo": {"username": username, "groups": ["system:serviceaccounts"], "extra": extra}}
    activation = {"request": celpy.json_to_cel(request), "object": celpy.json_to_cel(obj), "oldObject": celpy.json_to_cel(old)}
    for condition in policy["spec"]["matchConditions"]:
        if not bool(evaluate(condition["expression"], activation)):
            return None
    variables = {}
    for v in policy["spec"]["variables"]:
        activation["variables"] = celpy.json_to_cel(variables) if not variables else celpy.celtypes.MapType(variables)
        variables[celpy.celtypes.StringType(v["name"])] = evaluate(v["expression"], activation)
    activation["variables"] = celpy.celtypes.MapType(variables)
    failed = []
    for check in policy["spec"]["validations"]:
        if not bool(evaluate(check["expression"], activation)):
            failed.append(str(evaluate(check["messageExpression"], activation)) if "messageExpression" in check else check["message"])
    return failed


def slice_of(node):
    spec = {"driver": "gpu.fgpu.io", "pool": {"name": node or "cluster", "generation": 1, "resourceSliceCount": 1}, "devices": []}
    if node:
        spec["nodeName"] = node
    else:
        spec["allNodes"] = True
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"}, "spec": spec}


def check_policy(docs):
    policy = docs[("ValidatingAdmissionPolicy", "fgpu-kubelet-plugin-own-node-slices")]
    binding = docs[("ValidatingAdmissionPolicyBinding", "fgpu-kubelet-plugin-own-node-slices")]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] and binding["spec"]["validationActions"] == ["Deny"], binding
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["resourceslices"]}], rules
    plugin = "system:serviceaccount:fgpu-system:fgpu-kubelet-plugin"
    a, b = slice_of("node-a"), slice_of("node-b")
    # Its own node's slices: created, updated, deleted.
    assert admission(policy, plugin, "node-a", "CREATE", a, None) == []
    assert admission(policy, plugin, "node-a", "UPDATE", a, a) == []
    assert admission(policy, plugin, "node-a", "DELETE", None, a) == []
    # Another node's: refused, whichever way.
    for op, obj, old in [("CREATE", b, None), ("UPDATE", b, b), ("DELETE", None, b), ("UPDATE", b, a)]:
        failed = admission(policy, plugin, "node-a", op, obj, old)
        assert failed == ["the plugin of node node-a may not write the ResourceSlices of node node-b"], (op, failed)
    # A slice of no node, and a token of no node.
    assert admission(policy, plugin, "node-a", "CREATE", slice_of(None), None) == ["the plugin of node node-a may not write ResourceSlices of no node"]
    failed = admission(policy, plugin, None, "CREATE", a, None)
    assert len(failed) == 2 and "names no node" in failed[0], failed
    # Anyone else is not this policy's business.
    assert admission(policy, "system:node:node-a", "node-a", "CREATE", b, None) is None


def check_objects(docs):
    dc = docs[("DeviceClass", "gpu.fgpu.io")]
    assert dc["spec"]["selectors"][0]["cel"]["expression"] == 'device.driver == "gpu.fgpu.io"', dc
    tpl = docs[("ResourceClaimTemplate", "gpu-8gi-30pct")]
    req = tpl["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert req["deviceClassName"] == "gpu.fgpu.io" and req["capacity"]["requests"] == {"memory": "8Gi", "compute": "30"}, req
    dep = docs[("Deployment", "inference")]["spec"]["template"]["spec"]
    assert dep["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "gpu-8gi-30pct"}], dep
    assert all(c["resources"]["claims"] == [{"name": "gpu"}] for c in dep["containers"]), dep
    ds = docs[("DaemonSet", "fgpu-kubelet-plugin")]["spec"]["template"]["spec"]
    assert "runtimeClassName" not in ds, "no runtime class: the driver root is mounted"
    assert ds["terminationGracePeriodSeconds"] >= 45, "kubelet gives a call 45 s"
    c = ds["containers"][0]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in c["env"], c["env"]
    assert "--driver-root=/driver-root" in c["args"], c["args"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    for path in ["/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins", "/var/run/cdi", "/etc/cdi", "/var/lib/fgpu/dra", "/driver-root"]:
        assert path in mounts, path
    assert mounts["/var/lib/fgpu/dra"]["mountPropagation"] == "Bidirectional"
    assert mounts["/driver-root"]["readOnly"] is True
    volumes = {v["name"]: v for v in ds["volumes"]}
    assert volumes[mounts["/driver-root"]["name"]]["hostPath"]["path"] == "/"
    assert c["securityContext"]["privileged"] is True
    for probe in ("startupProbe", "livenessProbe"):
        command = c[probe]["exec"]["command"]
        assert command[:2] == ["/usr/local/lib/fgpu/fgpu-kubelet-plugin", "check"], command
        assert "--kubelet-registrar-directory-path=/var/lib/kubelet/plugins_registry" in command, command


def main():
    docs = documents(sys.argv[1:])
    check_objects(docs)
    check_policy(docs)
    print("ok")


if __name__ == "__main__":
    main()
