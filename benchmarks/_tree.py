"""A GPU-holding job for the benchmarks: root -> mid (forked) -> ``per`` workers (``sleep``).

``python benchmarks/_tree.py OUT PER SECONDS`` writes {root, mid, workers, sid, pgid} as JSON to OUT.
Holder chain: worker <- mid <- root <- (session leader, alive or gone) ... <- init.
"""

import json
import os
import sys

out, per, secs = sys.argv[1], int(sys.argv[2]), sys.argv[3]
root = os.getpid()
r, w = os.pipe()
mid = os.fork()
if mid == 0:
    os.close(r)
    pids = [os.posix_spawn("/bin/sleep", ["sleep", secs], os.environ) for _ in range(per)]
    os.write(w, json.dumps({"root": root, "mid": os.getpid(), "workers": pids,
                            "sid": os.getsid(0), "pgid": os.getpgid(0)}).encode())
    os.close(w)
    for p in pids:
        try:
            os.waitpid(p, 0)
        except OSError:
            pass
    os._exit(0)
os.close(w)
data = b""
while chunk := os.read(r, 65536):
    data += chunk
tmp = out + ".tmp"
with open(tmp, "w") as f:
    f.write(data.decode())
os.replace(tmp, out)
os.waitpid(mid, 0)
