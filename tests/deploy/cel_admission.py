"""Evaluates a ValidatingAdmissionPolicy and its binding over pods, as the API server
would admit them, with cel-python (the CEL reference semantics; no API server runs on
these machines). Run by the tools venv's Python (make tools-env), which has cel-python:
stdin {"policy": ..., "binding": ..., "cases": [{"pod": ..., "namespace": ...}]}, stdout a
list with, per case, null when the binding does not select the namespace, else the
messages the pod is denied with (an expression that fails to evaluate denies, under
failurePolicy Fail, and its error is listed as "error: ...")."""

import json
import sys

import celpy


def admit(policy, binding, pod, namespace):
    labels = namespace["metadata"].get("labels", {})
    for e in binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]:
        if e["operator"] != "Exists":
            raise ValueError(f"selector operator {e['operator']} is not evaluated here")
        if e["key"] not in labels:
            return None
    env = celpy.Environment()
    act = {"object": celpy.json_to_cel(pod), "namespaceObject": celpy.json_to_cel(namespace)}
    # variables.NAME, each evaluated over those before it. A string is stored as a CEL
    # string again: cel-python hands a concatenation back as a Python str, whose methods
    # (contains) it then cannot call.
    act["variables"] = celpy.celtypes.MapType({})
    for v in policy["spec"].get("variables", []):
        value = env.program(env.compile(v["expression"])).evaluate(act)
        if isinstance(value, str):
            value = celpy.celtypes.StringType(value)
        act["variables"][celpy.celtypes.StringType(v["name"])] = value
    errors = []
    for check in policy["spec"]["validations"]:
        try:
            ok = bool(env.program(env.compile(check["expression"])).evaluate(act))
        except celpy.CELEvalError as e:
            ok = False
            errors.append(f"error: {e}")
        if not ok:
            errors.append(" ".join(check["message"].split()))
    return errors


def main():
    req = json.load(sys.stdin)
    json.dump([admit(req["policy"], req["binding"], c["pod"], c["namespace"]) for c in req["cases"]], sys.stdout)


if __name__ == "__main__":
    main()
