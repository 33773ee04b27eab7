#!/usr/bin/env python3
"""Opens an HTML file in headless Chromium the way a person would, and says
what happened, as one JSON object on stdout:

  console        every console message the page caused (errors, CSP refusals)
  browser_console  Chromium's own messages, from its chrome:// pages (a "slow
                 network" notice of its new-tab page under load), which no page causes
  page_requests  every request that tried to leave the file
  browser_requests  the browser's own background requests (component updater,
                 clock), which no page causes
  load_s         seconds to open and lay out the page (--dump-dom), the median
                 of --repeat opens, and blank_s the same for an empty page
  text           the page's text (tags stripped)

Chromium runs in a network namespace of its own (unshare -n) with only
loopback, and a proxy on loopback records every request instead of
answering it: nothing can leave this machine, and nothing the page asks for
goes unseen. Usage: browse_report.py FILE.html [--screenshot PNG] [--repeat N]
"""
import argparse
import html
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

# Hosts Chromium contacts by itself (component updates, its clock), whatever
# the page: reported apart so that a page request is never hidden among them.
BROWSER_OWN = re.compile(r"(^|\.)(google\.com|googleapis\.com|gvt1\.com|gstatic\.com)(:\d+)?$")


def isolated():
    """Re-runs this script inside a fresh network namespace (root only)."""
    if os.environ.get("BROWSE_REPORT_ISOLATED") == "1":
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        return
    env = dict(os.environ, BROWSE_REPORT_ISOLATED="1")
    result = subprocess.run(["unshare", "-n", sys.executable] + sys.argv, env=env)
    sys.exit(result.returncode)


def start_proxy(seen):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.settimeout(2)
            try:
                first = conn.recv(8192).split(b"\r\n")[0].decode("latin-1")
            except OSError:
                first = "(no request line)"
            seen.append(first)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1]


def chromium(args, proxy_port, profile):
    base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-default-apps", "--hide-scrollbars", f"--user-data-dir={profile}",
            f"--proxy-server=http://127.0.0.1:{proxy_port}", "--enable-logging=stderr", "--v=0"]
    start = time.monotonic()
    done = subprocess.run(base + args, capture_output=True, text=True, timeout=120)
    return done, time.monotonic() - start


def host_of(request_line):
    parts = request_line.split()
    if len(parts) < 2:
        return ""
    target = parts[1]
    if parts[0] == "CONNECT":
        return target
    match = re.match(r"[a-z]+://([^/]+)", target)
    return match.group(1) if match else target


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    parser.add_argument("--screenshot")
    parser.add_argument("--repeat", type=int, default=1)
    options = parser.parse_args()
    isolated()
    url = "file://" + os.path.abspath(options.file)
    seen = []
    port = start_proxy(seen)
    console, loads, blanks, dom = [], [], [], ""
    with tempfile.TemporaryDirectory() as work:
        blank = os.path.join(work, "blank.html")
        with open(blank, "w") as f:
            f.write("<!DOCTYPE html><html><body></body></html>")
        for i in range(options.repeat):
            done, seconds = chromium(["--dump-dom", "file://" + blank], port, os.path.join(work, f"b{i}"))
            blanks.append(seconds)
            done, seconds = chromium(["--dump-dom", url], port, os.path.join(work, f"p{i}"))
            loads.append(seconds)
            dom = done.stdout
            console += [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
        if options.screenshot:
            done, _ = chromium(["--window-size=1000,3200", "--screenshot=" + os.path.abspath(options.screenshot),
                                url], port, os.path.join(work, "shot"))
            console += [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    time.sleep(0.3)  # let the proxy record what arrived last
    own_console = [line for line in console if "source: chrome://" in line]
    console = [line for line in console if "source: chrome://" not in line]
    page = [r for r in seen if not BROWSER_OWN.search(host_of(r))]
    own = [r for r in seen if BROWSER_OWN.search(host_of(r))]
    body = re.sub(r"<style.*?</style>", " ", dom, flags=re.S)
    text = html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body)))
    print(json.dumps({"console": console, "browser_console": own_console, "page_requests": page,
                      "browser_requests": own,
                      "load_s": statistics.median(loads), "blank_s": statistics.median(blanks),
                      "loads_s": loads, "dom_bytes": len(dom), "text": text}))


if __name__ == "__main__":
    main()
