"""python setp.py key.sub=value ... : set params.yaml values (YAML-parsed) in place."""

import sys
import yaml

p = yaml.safe_load(open("params.yaml"))
for kv in sys.argv[1:]:
    k, v = kv.split("=", 1)
    d = p
    *path, last = k.split(".")
    for part in path:
        d = d[part]
    assert last in d, k
    d[last] = yaml.safe_load(v)
yaml.safe_dump(p, open("params.yaml", "w"), sort_keys=False)
