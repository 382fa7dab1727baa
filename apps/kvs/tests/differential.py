#!/usr/bin/env python3
"""Differential test: the same random memcached command sequences against two servers.

Every answer is compared, except cas uniques (masked), `stats` values (a run of STAT lines
is compared as one marker) and the VERSION string.

    python3 differential.py --a 127.0.0.1:11211 --b 127.0.0.1:22122 [--seed 1] [--rounds 50]

Addresses may also come from KVS_DIFF_A / KVS_DIFF_B. Both servers must run with the same
-I (default 1m) and enough memory (-m) that nothing is evicted; both are flushed first.

Requests are sent pipelined: a batch of commands, then `mn` (answered `MN` by both) as a
sentinel, over three connections interleaved (so `cas` races between connections are
covered). Classic and meta commands, garbage lines, malformed commands, bad data chunks,
too-large values and overlong lines are mixed in (--no-meta leaves meta commands out).
Expiry times are chosen so that the outcome never depends on the clock, and the generator
avoids the few spots where memcached's own answer depends on its buffers or on references
held by other connections (see the comments in Gen).

--record FILE writes the sequences with server A's normalized answers, one round a line
(`conn mode request answer-line...`, see enc()), for tests/transcript.rs to replay against
the kvs engine without a network.

Needs only the Python standard library.
"""

import argparse
import os
import random
import re
import socket
import sys
import time

SENTINEL = b"mn\r\n"
TIMEOUT = 10.0
ITEM_MAX = 1024 * 1024  # -I 1m


def addr(s):
    host, port = s.rsplit(":", 1)
    return host, int(port)


class Conn:
    """One connection to one server, with a reader that understands VALUE blocks."""

    def __init__(self, address):
        self.address = address
        self.sock = socket.create_connection(address, timeout=TIMEOUT)
        self.buf = b""
        self.closed = False
        self.cas = {}  # key -> last cas unique seen on this server

    def send(self, data):
        try:
            self.sock.sendall(data)
        except OSError:
            self.closed = True

    def _fill(self):
        try:
            chunk = self.sock.recv(1 << 20)
        except socket.timeout:
            raise TimeoutError("no answer within %.0f s" % TIMEOUT)
        except OSError:
            chunk = b""
        if not chunk:
            self.closed = True
            return False
        self.buf += chunk
        return True

    def read_until_sentinel(self, expect_close=False):
        """Answer lines up to the sentinel's MN (excluded), as a list of raw lines; VALUE
        data blocks are kept as one element. Stops at EOF."""
        out = []
        pos = 0
        while True:
            nl = self.buf.find(b"\r\n", pos)
            if nl < 0:
                if self.closed or not self._fill():
                    out.append(b"<EOF>")
                    self.buf = b""
                    return out
                continue
            line = self.buf[pos:nl]
            if line.startswith(b"VALUE ") or line.startswith(b"VA "):
                parts = line.split(b" ")
                try:
                    n = int(parts[3] if parts[0] == b"VALUE" else parts[1])
                except (IndexError, ValueError):
                    n = -1
                if n >= 0:
                    end = nl + 2 + n + 2
                    while len(self.buf) < end:
                        if self.closed or not self._fill():
                            out.append(b"<EOF in data>")
                            self.buf = b""
                            return out
                    out.append(line)
                    out.append(self.buf[nl + 2 : nl + 2 + n])
                    pos = end
                    continue
            pos = nl + 2
            if line == b"MN" and not expect_close:
                self.buf = self.buf[pos:]
                return out
            out.append(line)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def normalize(lines):
    """Masks cas uniques, stats values and the version."""
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(b"VALUE ") or line.startswith(b"VA "):
            parts = line.split(b" ")
            if parts[0] == b"VALUE" and len(parts) == 5:
                parts[4] = b"<cas>"
            size = 3 if parts[0] == b"VALUE" else 1
            data = lines[i + 1] if i + 1 < len(lines) else b""
            if NUMBER_PADDED.match(data):
                # incr/decr rewrites a number in place padded with spaces, unless another
                # reference to the item is held (memcached keeps one for a while after
                # answering a get on any connection): then the value has its exact length.
                data = data.rstrip(b" ")
                if len(parts) > size:
                    parts[size] = str(len(data)).encode()
            line = b" ".join(parts)
            if parts[0] == b"VA":
                line = META_TTL.sub(b" t<ttl>", META_CAS.sub(b" c<cas>", line))
            out.append(line)
            if i + 1 < len(lines):
                out.append(data)
            i += 2
            continue
        if line.startswith(b"STAT "):
            if not out or out[-1] != b"<stats>":
                out.append(b"<stats>")
        elif line.startswith(b"VERSION "):
            out.append(b"VERSION <v>")
        elif line[:3] in (b"VA ", b"HD ", b"EN ", b"NS ", b"EX ", b"NF "):
            # Meta return flags: cas uniques differ; a TTL may be read a second apart.
            line = META_CAS.sub(b" c<cas>", line)
            out.append(META_TTL.sub(b" t<ttl>", line))
        else:
            out.append(line)
        i += 1
    return out


def record_cas(conn, lines):
    for i, line in enumerate(lines):
        if line.startswith(b"VALUE "):
            parts = line.split(b" ")
            if len(parts) == 5:
                conn.cas[parts[1]] = parts[4]


CAS_RE = re.compile(rb"@CAS:([^@]*)@")
# For a key whose cas unique was never seen: a value no server reaches, so that the outcome
# does not depend on how many items a server stored before the test.
UNSEEN_CAS = b"9999999999999"
NUMBER_PADDED = re.compile(rb"^[0-9]+ +$")
NUMERIC_START = re.compile(rb"^\s*[+-]?[0-9]")
META_CAS = re.compile(rb" c[0-9]+(?= |$)")
META_TTL = re.compile(rb" t[0-9]+(?= |$)")


def resolve(template, conn):
    """Replaces @CAS:key@ with the cas unique this server last gave for key (from gets)."""
    return CAS_RE.sub(lambda m: conn.cas.get(m.group(1), UNSEEN_CAS), template)


class Gen:
    """Random command sequences."""

    def __init__(self, rng, with_meta=True):
        self.r = rng
        self.with_meta = with_meta
        self.keys = [b"a", b"b", b"c", b"num", b"k:1", b"k\t2", b"\xff\xfe", b"x" * 250]

    def key(self):
        return self.r.choice(self.keys)

    def value(self, key=b""):
        """A value; numbers only for the key `num`, which alone sees incr/decr and never
        append/prepend: memcached pads an in-place incr result with spaces only when no
        other reference to the item is held, so appending to a padded number is racy."""
        r = self.r
        if key == b"num":
            if r.random() < 0.8:
                return str(r.choice([0, 1, 9, 10, 99, 100, 2**32, 2**64 - 1, r.randrange(10**6)])).encode()
            return r.choice([b"", b" 12", b"12 ", b"-5", b"12a", b"18446744073709551616", b"hjk"])
        while True:
            v = self._text()
            if not NUMERIC_START.match(v):
                return v

    def _text(self):
        r = self.r
        kind = r.random() * 0.65 + 0.35
        if kind < 0.4:
            # Binary, but no newline: a value that ends up parsed as a command line (after a
            # malformed storage line) must not form a command such as the sentinel.
            while True:
                v = bytes(r.choice([b for b in range(256) if b != 10]) for _ in range(r.randrange(1, 64)))
                if v.strip():
                    return v
        if kind < 0.42:
            # Long values, but never 2048..16383 bytes: if such a value is read as a command
            # line, memcached's answer depends on how the bytes arrive.
            return b"v" * r.choice([r.randrange(1000, 2000), r.randrange(20000, 200000)])
        # No letter that starts a command, for the same reason. Not only white space
        # either: memcached's incr reads past the end of such a value.
        while True:
            v = bytes(r.choice(b"hjkoXYZ \r\n") for _ in range(r.randrange(0, 40)))
            if v == b"" or v.strip():
                return v

    def exptime(self):
        # 0, far relative, negative, absolute past, absolute future; never near now.
        return self.r.choice([b"0", b"0", b"0", b"1000", b"-1", b"1000000000", b"2000000000", b"4294967296", b"+0", b"x"])

    def flags(self):
        return self.r.choice([b"0", b"0", b"1", b"4294967295", b"4294967296", b"-1", b"+7", b"abc", b"18446744073709551615"])

    def noreply(self):
        return b" noreply" if self.r.random() < 0.15 else b""

    def storage(self):
        r = self.r
        cmd = r.choice([b"set", b"set", b"add", b"replace", b"append", b"prepend", b"cas"])
        key = self.key() if r.random() > 0.02 else b"y" * 251
        if key == b"num" and cmd in (b"append", b"prepend"):
            cmd = b"set"
        flags, exptime = self.flags(), self.exptime()
        cas = r.choice([b"@CAS:" + key + b"@", b"@CAS:" + key + b"@", b"999999999", b"0", b"x"])
        roll = r.random()
        malformed = (
            len(key) > 250
            or flags in (b"-1", b"abc")
            or exptime == b"x"
            or (cmd == b"cas" and cas == b"x")
            or roll < 0.08
        )
        data = self.value(key)
        while malformed and len(data) >= 2000:
            # The data of a malformed command is read as command lines; a line of 16 KiB
            # or more makes memcached close the connection mid-batch, dropping the answers it
            # has not written yet (which depends on its buffering): keep it short.
            data = self.value(key)
        n = len(data)
        declared = n
        tail = b""
        if roll < 0.03:
            declared = n + r.randrange(1, 5)  # short data: bad chunk, filler keeps us in sync
            tail = b"z" * (declared + 2) + b"\r\n"
        elif roll < 0.06:
            declared = max(0, n - r.randrange(1, 3))
            data = data[:declared] + b"Z" * (n - declared + r.randrange(1, 3))
        line = cmd + b" " + key + b" " + flags + b" " + exptime + b" " + str(declared).encode()
        if 0.06 <= roll < 0.08:
            line = cmd + b" " + key + b" 0 0 -1"
        if cmd == b"cas":
            line += b" " + cas
        line += self.noreply()
        return line + b"\r\n" + data + b"\r\n" + tail

    def meta(self):
        """Meta commands: mostly valid flag sets, some malformed ones."""
        r = self.r
        # No `mn` here: it is the batch sentinel.
        kind = r.choice([b"mg", b"mg", b"ms", b"ms", b"md", b"ma", b"ma"])
        # Counters only on `num` (see value()); `ma` elsewhere would create some.
        key = r.choice([b"num", b"num", b"nokey"]) if kind == b"ma" else self.key()
        flags = []
        # Base64 keys decode to keys no other command uses: memcached echoes `k` from the
        # item, in base64 only if the item was stored with `b`.
        binary = kind != b"ma" and r.random() < 0.08
        if binary:
            key = r.choice([b"bTE=", b"bTI=", b"bTE=", b"YQ", b"!!!!"])
            flags.append(b"b")
        ttl = r.choice([b"0", b"1000", b"-1", b"2000000000"])
        opaque = b"O" + r.choice([b"", b"1", b"abc", b"x" * 31, b"x" * 32])
        # Not `h` or `s` on the counter: whether incr rewrote it in place (padded, keeping
        # the flag) depends on references memcached holds elsewhere.
        pool = {
            b"mg": [b"v", b"f", b"t", b"s" if key != b"num" else b"f", b"c", b"k",
                    b"h" if key != b"num" else b"f", b"q", opaque, b"T" + ttl, b"u"],
            b"ms": [b"F" + self.flags(), b"T" + ttl, b"C@CAS:" + key + b"@", b"q", b"c", b"k",
                    opaque, b"M" + r.choice([b"S", b"E", b"R", b"S"] if key == b"num"
                                            else [b"S", b"E", b"A", b"P", b"R", b"S"])],
            b"md": [b"q", b"k", opaque, b"C@CAS:" + key + b"@"],
            b"ma": [b"N" + r.choice([b"0", b"1000"]), b"J" + r.choice([b"0", b"5", b"18446744073709551615"]),
                    b"D" + r.choice([b"1", b"10", b"18446744073709551615"]),
                    b"M" + r.choice([b"I", b"D", b"+", b"-"]), b"q", b"v", b"t", b"c", b"k", opaque,
                    b"C@CAS:" + key + b"@", b"T" + r.choice([b"0", b"1000"])],
        }[kind]
        flags += list(dict.fromkeys(r.sample(pool, r.randrange(0, min(5, len(pool)) + 1))))
        # `ma` creating a counter under a cas compare (C with N) is not modelled.
        if kind == b"ma" and any(f.startswith(b"N") for f in flags):
            flags = [f for f in flags if not f.startswith(b"C")]
        # memcached reports a negative TTL as an unsigned wrap-around of its internal clock.
        if any(f.startswith(b"T-") or f.startswith(b"T2") for f in flags):
            flags = [f for f in flags if f != b"t"]
        if r.random() < 0.08:
            flags.append(r.choice([b"x", b"E1", b"Fx", b"Tx", b"Cx", b"MX", b"MAB", b"Jx", b"Dx", b"v", b"k"]))
            if kind == b"ma" and flags[-1] == b"MX":
                flags[-1] = b"Mi"
        line = kind + b" " + key
        data = b""
        if kind == b"ms":
            data = self.value(key)
            line += b" " + str(len(data)).encode()
        line += b"".join(b" " + f for f in flags) + b"\r\n"
        if kind == b"ms":
            line += data + b"\r\n"
        return line

    def too_large(self):
        n = ITEM_MAX + self.r.randrange(0, 100)
        return b"set " + self.key() + b" 0 0 " + str(n).encode() + self.noreply() + b"\r\n" + b"L" * n + b"\r\n"

    def command(self):
        r = self.r
        roll = r.random()
        if roll < 0.35:
            return self.storage()
        if roll < 0.52:
            cmd = r.choice([b"get", b"gets", b"gat", b"gats", b"gets"])
            keys = [self.key() for _ in range(r.randrange(0, 4))]
            args = ([self.exptime()] if cmd.startswith(b"gat") else []) + keys
            return b" ".join([cmd] + args) + b"\r\n"
        if roll < 0.60:
            cmd = r.choice([b"incr", b"decr"])
            delta = r.choice([b"1", b"5", b"100", b"18446744073709551615", b"0", b"-1", b"abc", b"18446744073709551616"])
            key = r.choice([b"num", b"num", b"num", b"nokey", b"z" * 251])
            return cmd + b" " + key + b" " + delta + self.noreply() + b"\r\n"
        if roll < 0.66:
            extra = r.choice([b"", b"", b" 0", b" noreply", b" 0 noreply", b" 1", b" x y"])
            return b"delete " + self.key() + extra + b"\r\n"
        if roll < 0.71:
            return b"touch " + self.key() + b" " + self.exptime() + self.noreply() + b"\r\n"
        if roll < 0.73:
            # No flush_all with an effect here: memcached decides which items a flush
            # invalidates partly by the second they were stored in, so its answer depends on the
            # clock (clients.py tests flush_all, delayed too). Only its error answer is compared.
            return b"flush_all x\r\n"
        if roll < 0.75:
            return r.choice([b"verbosity 1\r\n", b"verbosity\r\n", b"verbosity x\r\n", b"verbosity 1 noreply\r\n", b"version\r\n"])
        if roll < 0.76:
            return b"stats\r\n"
        if roll < 0.87 and self.with_meta:
            return self.meta()
        if roll < 0.9:
            return r.choice([
                b"\r\n", b"\n", b"foo\r\n", b"GET a\r\n", b"get\r\n", b"set a 0 0\r\n",
                b"incr\r\n", b"x\r\n", b"   get   a  b \r\n", b"get a\x00junk\r\n",
                b"set a 0 0 1 2 3\r\n", b"touch a\r\n", b"cas a 0 0 1\r\n", b"delete\r\n",
                b"bget a\r\n", b"stats nosuch\r\n", b"mx\r\n", b"shutdown\r\n",
                b"get " + b" ".join([b"a"] * 30) + b"\r\n",
                b"set " + b" ".join([b"1"] * 30) + b"\r\n",
            ])
        if roll < 0.905:
            return self.too_large()
        return self.storage()


def enc(data):
    """Transcript encoding: '.'-joined pieces, each hex bytes or '*HH:N' (byte HH, N times);
    '-' for no bytes."""
    if not data:
        return "-"
    pieces = []
    i = 0
    lit = bytearray()
    while i < len(data):
        j = i
        while j < len(data) and data[j] == data[i]:
            j += 1
        if j - i >= 16:
            if lit:
                pieces.append(lit.hex())
                lit = bytearray()
            pieces.append("*%02x:%d" % (data[i], j - i))
        else:
            lit += data[i:j]
        i = j
    if lit:
        pieces.append(lit.hex())
    return ".".join(pieces)


def run(args):
    rng = random.Random(args.seed)
    gen = Gen(rng, with_meta=not args.no_meta)
    servers = [addr(args.a), addr(args.b)]
    record = open(args.record, "w") if args.record else None
    failures = 0
    batches = 0
    for server in servers:
        c = Conn(server)
        c.send(b"flush_all\r\n" + SENTINEL)
        c.read_until_sentinel()
        c.close()
    nconn = 3
    conns = [[Conn(s) for _ in range(nconn)] for s in servers]
    t0 = time.time()
    for rnd in range(args.rounds):
        ci = rng.randrange(nconn)
        special = rng.random()
        if special < 0.02:
            template, mode = b"y" * 3000, "close"  # overlong line without newline
        elif special < 0.04:
            template, mode = b"get a\r\nquit\r\n", "close"
        elif special < 0.06:
            # A multi-get with a key over 250 bytes: memcached answers CLIENT_ERROR and also
            # drops the unsent answers of earlier requests (its output buffering), so it comes
            # first in its batch.
            cmd = rng.choice([b"get", b"gets", b"gat 0", b"gats 0"])
            template = cmd + b" a " + b"w" * 251 + b" b\r\n" + gen.command()
            mode = "sentinel"
        else:
            template = b"".join(gen.command() for _ in range(rng.randrange(1, 12)))
            mode = "sentinel"
        answers = []
        for si in range(2):
            c = conns[si][ci]
            c.send(resolve(template, c) + (SENTINEL if mode == "sentinel" else b""))
        for si in range(2):
            c = conns[si][ci]
            try:
                lines = c.read_until_sentinel(expect_close=(mode == "close"))
            except TimeoutError as e:
                lines = [b"<TIMEOUT %s>" % str(e).encode()]
            record_cas(c, lines)
            answers.append(normalize(lines))
        batches += 1
        if record:
            fields = [str(ci), mode, enc(template)] + [enc(l) for l in answers[0]]
            record.write(" ".join(fields) + "\n")
        if answers[0] != answers[1]:
            failures += 1
            print("MISMATCH in round %d (seed %d), connection %d" % (rnd, args.seed, ci))
            print("  sent: %r" % template[:2000])
            print("  A %s: %r" % (args.a, answers[0][:60]))
            print("  B %s: %r" % (args.b, answers[1][:60]))
            if failures >= args.max_failures:
                break
        if mode == "close":
            for si in range(2):
                conns[si][ci].close()
                conns[si][ci] = Conn(servers[si])
    for side in conns:
        for c in side:
            c.close()
    if record:
        record.close()
    print("%d passed, %d failed" % (batches - failures, failures))
    print("(seed %d, %d rounds, %.1f s)" % (args.seed, args.rounds, time.time() - t0), file=sys.stderr)
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", default=os.environ.get("KVS_DIFF_A", "127.0.0.1:22122"))
    p.add_argument("--b", default=os.environ.get("KVS_DIFF_B", "127.0.0.1:22123"))
    p.add_argument("--seed", type=int, default=int(os.environ.get("KVS_DIFF_SEED", "1")))
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--max-failures", type=int, default=5)
    p.add_argument("--record", help="write server A's transcript here")
    p.add_argument("--no-meta", action="store_true", help="leave out meta commands")
    sys.exit(run(p.parse_args()))


if __name__ == "__main__":
    main()
