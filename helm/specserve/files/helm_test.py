# The helm test hook's check (run with python3 -c; standard library only): the server answers /health,
# then completes a short prompt with at least one token. Settings come from SPECSERVE_* variables.
import json
import os
import sys
import urllib.request

url = os.environ["SPECSERVE_URL"].rstrip("/")
with urllib.request.urlopen(url + "/health", timeout=10) as r:
    print("GET /health ->", r.status)
headers = {"Content-Type": "application/json"}
key = os.environ.get("SPECSERVE_API_KEY", "").split(",")[0].strip()
if key:
    headers["Authorization"] = "Bearer " + key
body = {"model": os.environ["SPECSERVE_MODEL"], "prompt": os.environ.get("SPECSERVE_PROMPT", "Hello"),
        "max_tokens": int(os.environ.get("SPECSERVE_MAX_TOKENS", "4")), "temperature": 0}
request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), headers=headers)
with urllib.request.urlopen(request, timeout=300) as r:
    reply = json.load(r)
tokens = reply["usage"]["completion_tokens"]
print("POST /v1/completions ->", r.status, repr(reply["choices"][0]["text"]), tokens, "tokens")
sys.exit(0 if tokens >= 1 else 1)
