"""Can a job container reach the model hubs? Run by the image's own python3 in doctor's probe container.

Asked as the libraries ask (requests, its CA bundle, the proxy and endpoint variables of container.env); any HTTP
answer counts. DNS is outside requests' timeout, so each hub is asked in a thread joined for argv[1] seconds.
Prints `hub.<name>=ok` or `hub.<name>=<error>` per hub (the key=value contract of dockerlaunch/keyvalue.py).
Standard library only (requests if the image has it).
"""

import os
import re
import sys
import threading

WAIT = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
E = os.environ.get
hubs = {"huggingface.co": E("HF_ENDPOINT") or "https://huggingface.co",
        "modelscope.cn": E("MODELSCOPE_ENDPOINT") or "https://" + (E("MODELSCOPE_DOMAIN") or "www.modelscope.cn")}
got = {}


def ask(name, url):
    try:
        try:
            import requests
        except ImportError:
            import urllib.error
            import urllib.request
            try:
                urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=5)
            except urllib.error.HTTPError:
                pass
        else:
            requests.head(url, timeout=5, allow_redirects=False)
        got[name] = "ok"
    except Exception as e:
        text = " ".join(str(e).split()).split("Caused by ", 1)[-1]
        got[name] = type(e).__name__ + ": " + re.sub(r"^\w+\(\"?\w+\(.*?\): |[\"']\)+$", "", text)[:300]


threads = [threading.Thread(target=ask, args=kv, daemon=True) for kv in hubs.items()]
for t in threads:
    t.start()
for t in threads:
    t.join(WAIT)
for name in hubs:  # the key=value contract (dockerlaunch/keyvalue.py): %, controls as %XX
    value = got.get(name, f"no answer in {WAIT:g} s")
    value = "".join(f"%{ord(c):02X}" if c == "%" or ord(c) < 32 or ord(c) == 127 else c for c in value)
    print("hub." + name + "=" + value, flush=True)
