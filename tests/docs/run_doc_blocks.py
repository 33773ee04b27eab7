#!/usr/bin/python3
"""Runs the command blocks of Markdown pages that are marked runnable, so
that a documented command cannot rot.

A block is runnable when the line before its ```sh (or ```bash) fence is

    <!-- runnable -->
    <!-- runnable set=job.steps=10 set=eval.every=5 timeout=300 -->

`set=KEY=VALUE` (repeatable) is appended as `--set KEY=VALUE` to every
`lockstep run`, `lockstep coordinator` and `lockstep config` the block
calls: long examples run with fewer steps, the command as written
otherwise. `timeout=S` bounds the block (default 120 s).

The blocks of one page run in order, each in `bash -eo pipefail`, all in
one fresh folder that holds links to the source tree's examples/, python/,
tests/, deploy/ and docs/, and `build/lockstep` (also first on PATH): the
lockstep under test behind a wrapper that adds the `set=` overrides. Each
block runs in a process group of its own, killed when the block ends, so
nothing it started outlives it.

With --links, it runs nothing and checks instead that every relative link
of the pages (`[text](page.md#anchor)`) names a file that exists and,
with an anchor, a heading of that page.

Usage: run_doc_blocks.py --lockstep BUILD/lockstep --source SRC PAGE.md...
       run_doc_blocks.py --links PAGE.md...
Exit 0 when every block passed; 1 naming each failed block (PAGE:LINE,
its exit status, the end of its output); 2 for bad usage or a page with a
malformed marker.
"""
import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MARKER = re.compile(r"^<!--\s*runnable(?P<attrs>(?:\s+[a-z]+=\S+)*)\s*-->\s*$")
FENCE = re.compile(r"^```(sh|bash)\s*$")
LINKED = ["examples", "python", "tests", "deploy", "docs", ".venv"]


class Block:
    def __init__(self, page, line, script, overrides, timeout):
        self.page, self.line, self.script = page, line, script
        self.overrides, self.timeout = overrides, timeout


def marked_blocks(page):
    """The runnable blocks of `page`; ValueError naming the line of a bad marker."""
    with open(page, encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks = []
    i = 0
    while i < len(lines):
        if not lines[i].lstrip().startswith("<!-- runnable"):
            i += 1
            continue
        m = MARKER.match(lines[i].strip())
        if not m:
            raise ValueError(f"{page}:{i + 1}: malformed marker {lines[i].strip()!r} "
                             "(expected <!-- runnable [set=KEY=VALUE]... [timeout=S] -->)")
        overrides, timeout = [], 120
        for attr in m.group("attrs").split():
            name, _, value = attr.partition("=")
            if name == "set" and "=" in value:
                overrides.append(value)
            elif name == "timeout" and value.isdigit() and 0 < int(value) <= 600:
                timeout = int(value)
            else:
                raise ValueError(f"{page}:{i + 1}: unknown or bad marker attribute {attr!r} "
                                 "(allowed: set=KEY=VALUE, timeout=1..600)")
        if i + 1 >= len(lines) or not FENCE.match(lines[i + 1]):
            raise ValueError(f"{page}:{i + 1}: a runnable marker must stand right before a ```sh or ```bash fence")
        end = i + 2
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        if end == len(lines):
            raise ValueError(f"{page}:{i + 2}: the block is never closed")
        blocks.append(Block(page, i + 2, "\n".join(lines[i + 2:end]) + "\n", overrides, timeout))
        i = end + 1
    return blocks


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchor(heading):
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page):
    with open(page, encoding="utf-8") as f:
        fence = False
        found = set()
        for line in f:
            if line.startswith("```"):
                fence = not fence
            elif not fence and line.startswith("#"):
                found.add(anchor(line.lstrip("#")))
        return found


def broken_links(page):
    """Each relative link of `page` that names no file, or no heading of it."""
    problems = []
    with open(page, encoding="utf-8") as f:
        text = f.read()
    for number, line in enumerate(text.split("\n"), 1):
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, fragment = target.partition("#")
            file = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(file):
                problems.append(f"{page}:{number}: link to {target}: no file {file}")
            elif fragment and file.endswith(".md") and fragment not in anchors(file):
                problems.append(f"{page}:{number}: link to {target}: no heading with anchor #{fragment} in {file}")
    return problems


def make_workdir(source):
    work = tempfile.mkdtemp(prefix="lockstep-docs-")
    for name in LINKED:
        if os.path.exists(os.path.join(source, name)):
            os.symlink(os.path.join(source, name), os.path.join(work, name))
    os.makedirs(os.path.join(work, "build"))
    return work


def write_wrapper(work, lockstep, overrides):
    """build/lockstep in `work`: the lockstep under test, with this block's overrides."""
    extra = " ".join("--set " + shlex.quote(o) for o in overrides)
    wrapper = os.path.join(work, "build", "lockstep")
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\n"
                "# the lockstep under test; the block's set= overrides go on run, coordinator and config\n"
                f'case "$1" in run|coordinator|config) exec {shlex.quote(lockstep)} "$@" {extra} ;; esac\n'
                f'exec {shlex.quote(lockstep)} "$@"\n')
    os.chmod(wrapper, 0o755)


def run_block(block, work):
    env = dict(os.environ)
    env["PATH"] = os.path.join(work, "build") + os.pathsep + env.get("PATH", "")
    started = time.monotonic()
    # Output to a file, not a pipe: a process the block left in the
    # background would hold a pipe open after the block itself ended.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(["bash", "-eo", "pipefail", "-c", block.script], cwd=work, env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            status = proc.wait(timeout=block.timeout)
        except subprocess.TimeoutExpired:
            status = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # whatever the block left running
            except ProcessLookupError:
                pass
            proc.wait()
        log.seek(0)
        output = log.read().decode("utf-8", "replace")
    return status, output, time.monotonic() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lockstep", help="the lockstep binary under test")
    parser.add_argument("--source", help="the source tree (examples/, python/, ... are linked)")
    parser.add_argument("--links", action="store_true", help="check the pages' relative links instead")
    parser.add_argument("pages", nargs="+")
    args = parser.parse_args()
    if args.links:
        problems = [p for page in args.pages for p in broken_links(page)]
        print("\n".join(problems) if problems else f"every relative link of {len(args.pages)} pages resolves")
        return 1 if problems else 0
    if not args.lockstep or not args.source:
        parser.error("--lockstep and --source are needed to run blocks")
    lockstep = os.path.abspath(args.lockstep)
    if not os.access(lockstep, os.X_OK):
        print(f"--lockstep {args.lockstep}: not an executable", file=sys.stderr)
        return 2
    failed = total = 0
    for page in args.pages:
        try:
            blocks = marked_blocks(page)
        except (OSError, ValueError) as e:
            print(e, file=sys.stderr)
            return 2
        if not blocks:
            print(f"{page}: no runnable blocks")
            continue
        # One folder per page: its blocks build on each other (a run, then its status).
        work = make_workdir(os.path.abspath(args.source))
        try:
            for block in blocks:
                write_wrapper(work, lockstep, block.overrides)
                total += 1
                status, output, seconds = run_block(block, work)
                name = f"{os.path.relpath(block.page, args.source)}:{block.line}"
                if status == 0:
                    print(f"{name}: passed in {seconds:.1f} s")
                    continue
                failed += 1
                why = f"timed out after {block.timeout} s" if status is None else f"exit {status}"
                print(f"{name}: the block failed ({why}); it was:\n{block.script}--- its output, last 60 lines:")
                print("\n".join(output.rstrip().split("\n")[-60:]))
                print("---")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{failed} of {total} blocks failed" if failed else f"all {total} blocks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
