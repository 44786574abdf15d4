// The wire format: request lines, answer parsing, argument checks.

import assert from "node:assert/strict";
import { test } from "node:test";

import { InvalidArgumentError } from "../src/errors.js";
import {
  acquireKindLine,
  acquireLine,
  checkKey,
  checkKind,
  checkToken,
  fmtMs,
  leaseMs,
  MalformedAnswer,
  parseAnswer,
  quotedLikeServer,
  releaseLine,
  renewLine,
  semaphoreRefusal,
  splitAddr,
  waitMs,
} from "../src/proto.js";

const b = (s: string): Buffer => Buffer.from(s, "latin1");

test("durations in the protocol's seconds form", () => {
  assert.equal(fmtMs(30_000), "30");
  assert.equal(fmtMs(1500), "1.5");
  assert.equal(fmtMs(1), "0.001");
  assert.equal(fmtMs(10), "0.01");
  assert.equal(fmtMs(86_400_000), "86400");
  assert.equal(leaseMs(1.9), 1, "a lease rounds down");
  assert.equal(waitMs(0.1), 1, "a wait rounds up, never to 0 (no limit)");
  assert.equal(waitMs(undefined), 0);
  assert.throws(() => waitMs(0), InvalidArgumentError);
  assert.throws(() => leaseMs(0.5), InvalidArgumentError);
  assert.throws(() => leaseMs(Number.NaN), InvalidArgumentError);
  assert.throws(() => leaseMs("5" as unknown as number), InvalidArgumentError);
});

test("request lines", () => {
  assert.equal(acquireLine(b("k"), 30_000, 0).toString(), "A k 30 0\n");
  assert.equal(acquireLine(b("k"), 1500, 2).toString(), "A k 1.5 0.002\n");
  assert.equal(releaseLine(b("k"), 18446744073709551615n).toString(), "R k 18446744073709551615\n");
  assert.equal(renewLine(b("k"), 7n, 10_000).toString(), "N k 7 10\n");
});

test("keys and tokens", () => {
  assert.deepEqual(checkKey("clé"), Buffer.from("clé", "utf8"));
  assert.equal(checkKey("x".repeat(250)).length, 250);
  for (const bad of ["", " ", "a b", "a\tb", "x".repeat(251), "a\u007fb", "a\rb"]) {
    assert.throws(() => checkKey(bad), InvalidArgumentError, JSON.stringify(bad));
  }
  assert.throws(() => checkKey(7 as unknown as string), InvalidArgumentError);
  assert.equal(checkToken(1n), 1n);
  assert.equal(checkToken("18446744073709551615"), 2n ** 64n - 1n);
  assert.throws(() => checkToken(0n), InvalidArgumentError);
  assert.throws(() => checkToken(2n ** 64n), InvalidArgumentError);
  assert.throws(() => checkToken(5 as unknown as bigint), InvalidArgumentError);
});

test("answers parse, tokens beyond 2^53 exactly", () => {
  assert.deepEqual(parseAnswer(b("A k 9223372036854775807")), { op: "A", key: b("k"), token: 9223372036854775807n });
  assert.deepEqual(parseAnswer(b("A k 0007")), { op: "A", key: b("k"), token: 7n }, "leading zeros");
  assert.deepEqual(parseAnswer(b("A k 18446744073709551615")), { op: "A", key: b("k"), token: 2n ** 64n - 1n });
  assert.deepEqual(parseAnswer(b("T k")), { op: "T", key: b("k") });
  assert.deepEqual(parseAnswer(b("M k -")), { op: "M", key: b("k"), addr: null });
  assert.deepEqual(parseAnswer(b("M k 10.0.0.1:7171")), { op: "M", key: b("k"), addr: "10.0.0.1:7171" });
  assert.deepEqual(parseAnswer(b("R k 1")), { op: "R", key: b("k"), held: true });
  assert.deepEqual(parseAnswer(b("N k 0")), { op: "N", key: b("k"), held: false });
  assert.deepEqual(parseAnswer(b("S standby - 0")), { op: "S", role: "standby", addr: null, token: 0n });
  assert.deepEqual(parseAnswer(b("S active a:1 5\r")), { op: "S", role: "active", addr: "a:1", token: 5n });
  assert.deepEqual(parseAnswer(b("E bad lease \"x\" in line 1")), { op: "E", reason: 'bad lease "x" in line 1' });
  assert.deepEqual(parseAnswer(b("H ok")), { op: "H", text: "ok" });
  assert.deepEqual(parseAnswer(b("K jobs/a 17 29580 2")), {
    op: "K",
    key: b("jobs/a"),
    token: 17n,
    leaseMs: 29580n,
    waiters: 2n,
  });
  assert.deepEqual(parseAnswer(b("L 0")), { op: "L", cursor: 0n });
  assert.deepEqual(parseAnswer(Buffer.from([0x41, 0x20, 0xc3, 0xa9, 0x20, 0x31])).op, "A", "non-ASCII key bytes");
});

test("malformed answers are refused, never crash", () => {
  const bad = [
    "",
    "A",
    "A k",
    "A k 0",
    "A k -1",
    "A k 18446744073709551616",
    "A k 1 2",
    "A k 1e3",
    "A  k 1",
    "A k 1 ",
    "T",
    "T k x",
    "R k 2",
    "R k 10",
    "N k",
    "S active a:1",
    "S leader a:1 1",
    "S active a:1 x",
    "M k",
    "M k a\u0001b",
    "X k 1",
    "AA k 1",
    "a k 1",
    "K k 1 2",
    "L x",
    "A " + "x".repeat(251) + " 1",
    "A k\u007f 1",
    "E",
  ];
  for (const line of bad) assert.throws(() => parseAnswer(b(line)), MalformedAnswer, JSON.stringify(line));
  // Random bytes: MalformedAnswer or an answer, nothing else.
  for (let i = 0; i < 5000; i++) {
    const n = Math.floor(Math.random() * 40);
    const line = Buffer.from(Array.from({ length: n }, () => (Math.random() < 0.3 ? 0x20 : Math.floor(Math.random() * 256))));
    if (Math.random() < 0.5 && n > 0) line[0] = "ATMRNSEHKLGC".charCodeAt(Math.floor(Math.random() * 12));
    if (Math.random() < 0.5 && n > 1) line[1] = 0x20;
    try {
      parseAnswer(line);
    } catch (e) {
      assert.ok(e instanceof MalformedAnswer, `${line.toString("hex")}: ${String(e)}`);
    }
  }
});

test("addresses", () => {
  assert.deepEqual(splitAddr("127.0.0.1:7171"), { host: "127.0.0.1", port: 7171 });
  assert.deepEqual(splitAddr("[::1]:7171"), { host: "::1", port: 7171 });
  for (const bad of ["", "host", "host:", ":7171", "host:0", "host:65536", "host:x"]) {
    assert.throws(() => splitAddr(bad), InvalidArgumentError, bad);
  }
});

test("kinds: shared and permits checked before sending, G and C lines", () => {
  assert.deepEqual(checkKind(undefined, undefined), { op: "A", limit: 0 });
  assert.deepEqual(checkKind(false, undefined), { op: "A", limit: 0 });
  assert.deepEqual(checkKind(true, undefined), { op: "G", limit: 0 });
  assert.deepEqual(checkKind(undefined, 1), { op: "C", limit: 1 });
  assert.deepEqual(checkKind(false, 65536), { op: "C", limit: 65536 });
  const bad: Array<[unknown, unknown]> = [
    [true, 2],
    [undefined, 0],
    [undefined, 65537],
    [undefined, -1],
    [undefined, 1.5],
    [undefined, Number.NaN],
    [undefined, Number.POSITIVE_INFINITY],
    [undefined, "2"],
    [undefined, 2n],
    [undefined, null],
    ["yes", undefined],
    [1, undefined],
  ];
  for (const [shared, permits] of bad) {
    assert.throws(() => checkKind(shared, permits), InvalidArgumentError, `${String(shared)}, ${String(permits)}`);
  }
  assert.equal(acquireKindLine(checkKind(true, undefined), b("k"), 1500, 0).toString(), "G k 1.5 0\n");
  assert.equal(acquireKindLine(checkKind(false, 7), b("k"), 30_000, 250).toString(), "C k 7 30 0.25\n");
  assert.equal(acquireKindLine(checkKind(false, undefined), b("k"), 30_000, 1).toString(), "A k 30 0.001\n");
  assert.throws(() => acquireKindLine({ op: "C", limit: 0 }, b("k"), 1000, 0), /unchecked kind/);
});

test("the answers of G and C parse within their bounds", () => {
  const k = b("k");
  assert.deepEqual(parseAnswer(b("G k 17")), { op: "G", key: k, token: 17n, refused: null });
  assert.deepEqual(parseAnswer(b("C k 18446744073709551615")), { op: "C", key: k, token: 2n ** 64n - 1n, refused: null });
  assert.deepEqual(parseAnswer(b("G k 0")), { op: "G", key: k, token: 0n, refused: null }, "the wait ran out");
  assert.deepEqual(parseAnswer(b("C k 000")), { op: "C", key: k, token: 0n, refused: null }, "zero in any form");
  assert.deepEqual(parseAnswer(b("G k semaphore 3")), { op: "G", key: k, token: 0n, refused: 3 });
  assert.deepEqual(parseAnswer(b("C k semaphore 65536")), { op: "C", key: k, token: 0n, refused: 65536 });
  assert.deepEqual(parseAnswer(b("C k semaphore 1")), { op: "C", key: k, token: 0n, refused: 1 });
  assert.deepEqual(parseAnswer(b("C k lock")), { op: "C", key: k, token: 0n, refused: 0 });
  for (const line of [
    "G k lock",
    "G k",
    "C k",
    "G k semaphore",
    "C k semaphore 0",
    "C k semaphore 65537",
    "C k semaphore 99999999999999999999999",
    "G k semaphore -1",
    "G k semaphore 2 3",
    "G k -1",
    "C k 18446744073709551616",
    "C k lock 1",
    "C k LOCK",
    "G k Semaphore 2",
    "G k 1 2",
    "G  k 1",
    "GG k 1",
    "G " + "x".repeat(251) + " 1",
  ]) {
    assert.throws(() => parseAnswer(b(line)), MalformedAnswer, JSON.stringify(line));
  }
});

test("the refusal of an exclusive acquire of a semaphore key, as the server quotes it", () => {
  const why = 'a:1 says: E key "p" is a semaphore of 2 permits: acquire it with C in line 8';
  assert.deepEqual(semaphoreRefusal(why), { quoted: "p", limit: 2 });
  assert.equal(semaphoreRefusal('E lock table full: 1 locks (--max-locks) in line 2'), null);
  assert.equal(semaphoreRefusal('E key "p" is a semaphore: acquire it with C'), null);
  assert.equal(quotedLikeServer(b('a"b\\c')), "a\\x22b\\x5cc");
  assert.equal(quotedLikeServer(Buffer.from("clé")), "cl\\xc3\\xa9");
  assert.equal(quotedLikeServer(b("x".repeat(41))), `${"x".repeat(40)}...`);
  assert.equal(quotedLikeServer(b("x".repeat(40))), "x".repeat(40));
  for (const key of [b("p"), Buffer.from("clé"), b('a"b\\'), b("y".repeat(250)), b("z".repeat(40))]) {
    const q = quotedLikeServer(key);
    assert.deepEqual(semaphoreRefusal(`E key "${q}" is a semaphore of 65536 permits: acquire it with C in line 1`), {
      quoted: q,
      limit: 65536,
    });
  }
  assert.equal(semaphoreRefusal('E key "p" is a semaphore of 99999 permits: acquire it with C')?.limit, 0, "out of range: not trusted");
});
