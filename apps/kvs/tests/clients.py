#!/usr/bin/env python3
"""Real memcached clients against a server: pymemcache for every command, libmemcached's
command-line tools (memccp, memccat, memcrm, memcflush, memcstat, memctouch, memcexist,
memcslap, memccapable) when installed, plus expiry, eviction, cas races between
connections and pipelined answers in request order.

    python3 clients.py 127.0.0.1:11211          # or KVS_ADDR=127.0.0.1:11211
    python3 clients.py --only pipelining,cas_race HOST:PORT

The eviction test needs a server started with a small memory limit (-m 8 or less) and is
skipped otherwise. The server is flushed by the tests. Written to pass against memcached 1.6
and kvs alike.

Needs: pip install pymemcache; Debian package libmemcached-tools (optional, for the tools).
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheClientError, MemcacheServerError, MemcacheUnknownCommandError

ADDR = None  # (host, port)


def client(**kw):
    return Client(ADDR, connect_timeout=5, timeout=10, default_noreply=False, **kw)


def raw(data, wait_for=None, timeout=5.0):
    """Sends bytes on a fresh connection, returns everything answered until `wait_for`
    appears at the end, the server closes, or `timeout`."""
    s = socket.create_connection(ADDR, timeout=timeout)
    s.sendall(data)
    out = b""
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            if wait_for is not None and out.endswith(wait_for):
                break
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            out += chunk
    except socket.timeout:
        pass
    s.close()
    return out


PATIENCE = 60.0  # seconds any one wait may take before its test fails


def run_threads(worker, n, what):
    """Runs `worker` on `n` threads and waits for them, at most PATIENCE seconds; a worker's
    exception fails the test."""
    errors = []

    def guarded():
        try:
            worker()
        except Exception as e:  # reported below, on the test's thread
            errors.append(e)

    ts = [threading.Thread(target=guarded, daemon=True) for _ in range(n)]
    for t in ts:
        t.start()
    deadline = time.time() + PATIENCE
    for t in ts:
        t.join(max(0.0, deadline - time.time()))
        if t.is_alive():
            raise AssertionError("gave up after %.0f s waiting for %s" % (PATIENCE, what))
    if errors:
        raise errors[0]


def eq(got, want, what=""):
    if got != want:
        raise AssertionError("%s: got %r, want %r" % (what, got, want))


TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


@test
def storage_commands():
    c = client()
    c.flush_all()
    eq(c.set("k", b"v1", expire=0), True, "set")
    eq(c.get("k"), b"v1", "get")
    eq(c.add("k", b"x"), False, "add existing")
    eq(c.add("k2", b"x"), True, "add new")
    eq(c.replace("k", b"v2"), True, "replace existing")
    eq(c.replace("nope", b"v2"), False, "replace missing")
    eq(c.append("k", b"-tail"), True, "append")
    eq(c.prepend("k", b"head-"), True, "prepend")
    eq(c.get("k"), b"head-v2-tail", "after append/prepend")
    eq(c.append("nope", b"x"), False, "append missing")
    eq(c.prepend("nope", b"x"), False, "prepend missing")
    eq(c.get_many(["k", "k2", "nope"]), {"k": b"head-v2-tail", "k2": b"x"}, "get_many")


@test
def flags_survive_append():
    c = client()
    c.flush_all()
    # pymemcache passes flags through its serde; use raw lines for exact flags.
    eq(raw(b"set f 4294967295 0 1\r\na\r\nappend f 7 0 1\r\nb\r\nget f\r\n", b"END\r\n"),
       b"STORED\r\nSTORED\r\nVALUE f 4294967295 2\r\nab\r\nEND\r\n", "flags kept by append")


@test
def gets_and_cas():
    c = client()
    c.flush_all()
    c.set("c", b"1")
    value, token = c.gets("c")
    eq(value, b"1", "gets value")
    eq(c.cas("c", b"2", token), True, "cas with fresh token")
    eq(c.cas("c", b"3", token), False, "cas with stale token")
    eq(c.cas("missing", b"3", token), None, "cas on missing key")
    eq(c.get("c"), b"2", "value after cas")
    many = c.gets_many(["c", "missing"])
    eq(list(many.keys()), ["c"], "gets_many")


@test
def delete_and_noreply():
    c = client()
    c.flush_all()
    c.set("d", b"1")
    eq(c.delete("d", noreply=False), True, "delete")
    eq(c.delete("d", noreply=False), False, "delete missing")
    c.set("d", b"1", noreply=True)
    eq(c.get("d"), b"1", "set noreply")
    c.delete("d", noreply=True)
    eq(c.get("d"), None, "delete noreply")


@test
def incr_decr():
    c = client()
    c.flush_all()
    c.set("n", b"10")
    eq(c.incr("n", 5), 15, "incr")
    eq(c.decr("n", 100), 0, "decr floors at 0")
    c.set("n", b"18446744073709551615")
    eq(c.incr("n", 1), 0, "incr wraps at 2^64")
    eq(c.incr("missing", 1), None, "incr missing")
    c.set("n", b"100")
    eq(c.decr("n", 1), 99, "decr")
    eq(c.get("n"), b"99 ", "decr rewrites in place, padded")
    c.set("s", b"abc")
    try:
        c.incr("s", 1)
        raise AssertionError("incr on text did not fail")
    except MemcacheClientError as e:
        eq(str(e), "b'cannot increment or decrement non-numeric value'", "incr error")


@test
def touch_and_gat():
    c = client()
    c.flush_all()
    c.set("t", b"v", expire=1)
    eq(c.touch("t", expire=100), True, "touch")
    eq(c.touch("missing", expire=100), False, "touch missing")
    eq(raw(b"gat 100 t missing\r\n", b"END\r\n"), b"VALUE t 0 1\r\nv\r\nEND\r\n", "gat")
    got = raw(b"gats 100 t\r\n", b"END\r\n")
    assert got.startswith(b"VALUE t 0 1 ") and got.endswith(b"\r\nv\r\nEND\r\n"), got
    time.sleep(2.1)
    eq(c.get("t"), b"v", "touched item outlived its first expiry")


@test
def expiry():
    c = client()
    c.flush_all()
    now = int(time.time())
    c.set("e1", b"v", expire=1)
    c.set("e_abs", b"v", expire=now + 2)
    c.set("e_past", b"v", expire=now - 10)
    c.set("e_never", b"v", expire=0)
    eq(raw(b"set e_neg 0 -1 1\r\nv\r\nget e_neg\r\n", b"END\r\n"), b"STORED\r\nEND\r\n", "negative")
    eq(c.get("e_past"), None, "absolute time in the past")
    eq(c.get("e_abs"), b"v", "absolute time in the future")
    time.sleep(3.1)
    eq(c.get("e1"), None, "relative expiry")
    eq(c.get("e_abs"), None, "absolute expiry")
    eq(c.get("e_never"), b"v", "no expiry")


@test
def flush_all_with_delay():
    c = client()
    c.flush_all()
    c.set("f", b"v")
    eq(raw(b"flush_all 2\r\n", b"OK\r\n"), b"OK\r\n", "delayed flush")
    eq(c.get("f"), b"v", "still there before the delay")
    time.sleep(3.1)
    eq(c.get("f"), None, "gone after the delay")
    c.set("f", b"w")
    eq(c.get("f"), b"w", "new items live")


@test
def version_verbosity_stats():
    c = client()
    v = c.version()
    assert v.startswith(b"1.6"), v
    eq(raw(b"verbosity 1\r\n", b"\r\n"), b"OK\r\n", "verbosity")
    stats = c.stats()
    for name in [b"curr_items", b"total_items", b"bytes", b"get_hits", b"get_misses",
                 b"evictions", b"curr_connections", b"cmd_get", b"cmd_set", b"limit_maxbytes"]:
        assert name in stats, "stats lacks %r" % name
    assert stats[b"curr_connections"] >= 1
    settings = c.stats("settings")
    assert b"item_size_max" in settings and b"maxbytes" in settings


@test
def stats_count():
    c = client()
    c.flush_all()
    before = c.stats()
    c.set("s1", b"v")
    c.get("s1")
    c.get("s_missing")
    after = c.stats()
    eq(after[b"cmd_set"] - before[b"cmd_set"], 1, "cmd_set")
    eq(after[b"get_hits"] - before[b"get_hits"], 1, "get_hits")
    eq(after[b"get_misses"] - before[b"get_misses"], 1, "get_misses")
    # memcached drops flushed items lazily, so curr_items may still count them.
    assert after[b"curr_items"] >= 1, after[b"curr_items"]


@test
def errors_like_memcached():
    cases = [
        (b"foo\r\n", b"ERROR\r\n"),
        (b"get\r\n", b"ERROR\r\n"),
        (b"set a 0 0 -1\r\n", b"CLIENT_ERROR bad command line format\r\n"),
        (b"set a 0 0 1\r\nxx\r\n", b"CLIENT_ERROR bad data chunk\r\nERROR\r\n"),
        (b"incr a abc\r\n", b"CLIENT_ERROR invalid numeric delta argument\r\n"),
        (b"touch a x\r\n", b"CLIENT_ERROR invalid exptime argument\r\n"),
        (b"delete a 1\r\n", b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"),
        (b"get " + b"k" * 251 + b"\r\n", b"CLIENT_ERROR bad command line format\r\n"),
    ]
    for req, want in cases:
        eq(raw(req, want), want, repr(req[:30]))
    big = 2 * 1024 * 1024
    eq(raw(b"set big 0 0 %d\r\n" % big + b"x" * big + b"\r\nget big\r\n", b"END\r\n"),
       b"SERVER_ERROR object too large for cache\r\nEND\r\n", "too large")
    c = client()
    try:
        c.set("big", b"x" * big)
        raise AssertionError("too large value accepted")
    except MemcacheServerError as e:
        assert "object too large" in str(e), e
    # A line over 2048 bytes without a newline closes the connection.
    eq(raw(b"x" * 3000, timeout=2.0), b"", "overlong line")


@test
def binary_keys_and_values():
    c = client()
    c.flush_all()
    value = bytes(range(256)) * 40
    c.set("bin", value)
    eq(c.get("bin"), value, "binary value")
    eq(raw(b"set \xff\x01k 0 0 1\r\nx\r\nget \xff\x01k\r\n", b"END\r\n"),
       b"STORED\r\nVALUE \xff\x01k 0 1\r\nx\r\nEND\r\n", "binary key")
    k = "k" * 250
    c.set(k, b"long key")
    eq(c.get(k), b"long key", "250-byte key")


@test
def large_values():
    c = client()
    c.flush_all()
    for size in (1000, 100_000, 1_000_000):
        v = os.urandom(size)
        c.set("large%d" % size, v)
        eq(c.get("large%d" % size), v, "value of %d bytes" % size)


@test
def pipelining_in_order():
    n = 500
    req = b"".join(b"set p%d 0 0 %d\r\n%d\r\n" % (i, len(str(i)), i) for i in range(n))
    req += b"".join(b"get p%d\r\nincr p%d 1\r\n" % (i, i) for i in range(n))
    want = b"STORED\r\n" * n + b"".join(
        b"VALUE p%d 0 %d\r\n%d\r\nEND\r\n%d\r\n" % (i, len(str(i)), i, i + 1) for i in range(n))
    got = raw(req, want[-20:], timeout=20)
    eq(got, want, "pipelined answers in request order")
    keys = b" ".join(b"p%d" % i for i in range(n))
    got = raw(b"get " + keys + b"\r\n", b"END\r\n", timeout=20)
    assert got.count(b"VALUE") == n, "multi-get of %d keys" % n
    order = [line.split(b" ")[1] for line in got.split(b"\r\n") if line.startswith(b"VALUE")]
    eq(order, [b"p%d" % i for i in range(n)], "multi-get order")


@test
def cas_race():
    c = client()
    c.flush_all()
    c.set("ctr", b"0")
    threads, rounds = 4, 100
    def worker():
        cl = client()
        done = 0
        while done < rounds:
            v, tok = cl.gets("ctr")
            if cl.cas("ctr", str(int(v) + 1).encode(), tok):
                done += 1
    run_threads(worker, threads, "the cas workers")
    eq(c.get("ctr"), str(threads * rounds).encode(), "cas increments from racing connections")


@test
def incr_race():
    c = client()
    c.flush_all()
    c.set("ictr", b"0")
    def worker():
        cl = client()
        for _ in range(200):
            cl.incr("ictr", 1)
    run_threads(worker, 4, "the incr workers")
    eq(int(c.get("ictr").strip()), 800, "concurrent incr")


@test
def many_connections():
    conns = [client() for _ in range(50)]
    for i, cl in enumerate(conns):
        cl.set("mc%d" % i, b"%d" % i)
    for i, cl in enumerate(conns):
        eq(cl.get("mc%d" % ((i + 1) % 50)), b"%d" % ((i + 1) % 50), "cross-connection read")
    for cl in conns:
        cl.close()


@test
def quit_closes():
    eq(raw(b"version\r\nquit\r\nversion\r\n", timeout=2.0).count(b"VERSION"), 1, "quit")


@test
def eviction():
    c = client()
    limit = int(c.stats("settings")[b"maxbytes"])
    if limit > 8 << 20:
        print("    (skipped: needs a server with -m 8 or less; this one has %d MB)" % (limit >> 20))
        return
    c.flush_all()
    before = c.stats()[b"evictions"]
    value = b"e" * 100_000
    n = 3 * limit // len(value)
    for i in range(n):
        c.set("ev%d" % i, value)
    stats = c.stats()
    assert stats[b"evictions"] > before, "no evictions after writing 3x the memory limit"
    assert stats[b"bytes"] <= limit, "bytes %d over the limit %d" % (stats[b"bytes"], limit)
    eq(c.get("ev%d" % (n - 1)), value, "newest item kept")
    eq(c.get("ev0"), None, "oldest item evicted")
    # LRU: a key read often survives.
    c.set("hot", b"h")
    for i in range(n):
        c.set("ev2_%d" % i, value)
        if i % 5 == 0:
            eq(c.get("hot"), b"h", "hot key evicted at step %d" % i)


def tool(name):
    path = shutil.which(name)
    if not path:
        print("    (%s not installed: apt-get install libmemcached-tools)" % name)
    return path


@test
def libmemcached_tools():
    servers = "--servers=%s:%d" % ADDR
    c = client()
    c.flush_all()
    if not tool("memccp"):
        return
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "toolfile")
        with open(path, "wb") as f:
            f.write(b"from memccp\n")
        subprocess.run(["memccp", servers, path], check=True, capture_output=True, timeout=30)
        out = subprocess.run(["memccat", servers, "toolfile"], check=True, capture_output=True, timeout=30)
        eq(out.stdout.rstrip(b"\n"), b"from memccp", "memccat")
    subprocess.run(["memcexist", servers, "toolfile"], check=True, capture_output=True, timeout=30)
    subprocess.run(["memctouch", servers, "--expire=100", "toolfile"], check=True, capture_output=True, timeout=30)
    subprocess.run(["memcrm", servers, "toolfile"], check=True, capture_output=True, timeout=30)
    eq(c.get("toolfile"), None, "memcrm")
    c.set("x", b"1")
    subprocess.run(["memcflush", servers], check=True, capture_output=True, timeout=30)
    eq(c.get("x"), None, "memcflush")
    out = subprocess.run(["memcstat", servers], check=True, capture_output=True, timeout=30)
    assert b"curr_items" in out.stdout, out.stdout[:200]
    out = subprocess.run(["memcslap", servers, "--concurrency=4", "--execute-number=2000"],
                         capture_output=True, timeout=120)
    eq(out.returncode, 0, "memcslap exit status (stderr %r)" % out.stderr[-300:])


@test
def memccapable():
    if not tool("memccapable"):
        return
    host, port = ADDR
    # -a: ASCII protocol only (kvs has no binary protocol).
    out = subprocess.run(["memccapable", "-h", host, "-p", str(port), "-a"],
                         capture_output=True, timeout=120)
    text = out.stdout.decode(errors="replace") + out.stderr.decode(errors="replace")
    failed = [l for l in text.splitlines() if "[FAIL]" in l]
    assert out.returncode == 0 and not failed, "memccapable:\n" + text[-2000:]


def main():
    global ADDR
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("addr", nargs="?", default=os.environ.get("KVS_ADDR", "127.0.0.1:11211"))
    p.add_argument("--only", help="comma-separated test names")
    args = p.parse_args()
    host, port = args.addr.rsplit(":", 1)
    ADDR = (host, int(port))
    chosen = [t for t in TESTS if not args.only or t.__name__ in args.only.split(",")]
    passed = failed = 0
    for t in chosen:
        start = time.time()
        try:
            t()
            passed += 1
            print("ok   %-24s %.1fs" % (t.__name__, time.time() - start))
        except Exception:
            failed += 1
            print("FAIL %-24s" % t.__name__)
            traceback.print_exc()
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
