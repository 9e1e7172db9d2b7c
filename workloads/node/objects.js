'use strict';
/*
 * objects.js - a node batch job for farmem's benchmarks: many small JavaScript objects, indexed
 * by a Map, shuffled and relinked, then hashed.
 *
 *     node --max-old-space-size=M --max-semi-space-size=16 objects.js --objects N [--passes P]
 *
 * It builds N objects (a number, a string key, a small array and a link to another object) and
 * a Map from each key to its object. Each of the P passes shuffles the array of objects
 * (Fisher-Yates) and walks it in that order: every object gets a new value, a link to the next
 * object of the walk (so after a pass the links form one cycle through all N objects, in the
 * shuffled order), every fourth a new array (the old one becomes garbage, usually in the old
 * generation by then), and every eighth a new key (its Map entry is deleted and set again). The
 * objects end up scattered over the heap and the walks touch them in random order, as a
 * long-running node service's caches do.
 *
 * The caller fixes the heap limits: node sizes its default heap from the memory it may use,
 * which in a memory cgroup is the cgroup's limit, so a capped run would otherwise collect
 * differently (or run out of heap) where the native run did not.
 *
 * Everything random comes from a seeded xorshift128, so the output does not depend on node's
 * version or the machine. At the end it checks that the links form one cycle of length N and
 * that the Map holds exactly the N objects under their current keys, then prints a digest: FNV-1a
 * (two 32-bit lanes) over every object's fields in the order of the cycle, for the caller to
 * compare with a native run's.
 *
 * Output: "objects: build ...", "objects: passK updates=N secs=S" per pass, then
 * "objects: OK objects=N checksum=HEX updates_per_sec=U" (exit 0), or "objects: BAD ..." (exit 1).
 */

function usage(msg) {
  process.stderr.write(`objects: ${msg}\nusage: node objects.js --objects N [--passes P]\n`);
  process.exit(2);
}

let n = 0;
let passes = 2;
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i += 2) {
  const v = argv[i + 1];
  if (v === undefined) usage(`missing value for ${argv[i]}`);
  if (!/^\d+$/.test(v)) usage(`bad number for ${argv[i]}: ${v}`);
  if (argv[i] === '--objects') n = Number(v);
  else if (argv[i] === '--passes') passes = Number(v);
  else usage(`unknown flag ${argv[i]}`);
}
if (n < 16 || passes < 1) usage('--objects must be at least 16 and --passes at least 1');

// xorshift128 (Marsaglia), 32-bit lanes: the next pseudo-random uint32.
let s0 = 0x9e3779b9, s1 = 0x243f6a88, s2 = 0xb7e15162, s3 = 0x2545f491;
function next() {
  let t = s3;
  const s = s0;
  s3 = s2;
  s2 = s1;
  s1 = s;
  t ^= t << 11;
  t ^= t >>> 8;
  s0 = (t ^ s ^ (s >>> 19)) >>> 0;
  return s0;
}
// below is a pseudo-random int in [0, m) (m < 2^32; the modulo's bias does not matter here).
function below(m) {
  return next() % m;
}

function newKey() {
  return next() & 0x3fffffff; // a small integer: V8 keeps it unboxed
}
function newTags() {
  const t = new Array(2 + below(4));
  for (let i = 0; i < t.length; i++) t[i] = next() & 0x3fffffff;
  return t;
}

const now = () => Number(process.hrtime.bigint()) / 1e9;
let t0 = now();
const objs = new Array(n);
const index = new Map();
for (let i = 0; i < n; i++) {
  let k = newKey();
  while (index.has(k)) k = newKey();
  const o = { id: i, val: next() & 0x3fffffff, key: k, tags: newTags(), next: null };
  objs[i] = o;
  index.set(k, o);
}
for (let i = 0; i < n; i++) objs[i].next = objs[below(n)];
console.log(`objects: build objects=${n} secs=${(now() - t0).toFixed(3)}`);

let updSecs = 0;
for (let p = 1; p <= passes; p++) {
  t0 = now();
  for (let i = n - 1; i > 0; i--) {
    const j = below(i + 1);
    const o = objs[i];
    objs[i] = objs[j];
    objs[j] = o;
  }
  for (let i = 0; i < n; i++) {
    const o = objs[i];
    o.val = (Math.imul(o.val, 0x01000193) ^ next()) & 0x3fffffff;
    o.next = objs[i + 1 < n ? i + 1 : 0];
    const r = next();
    if ((r & 3) === 0) o.tags = newTags();
    if ((r & 28) === 0) {
      index.delete(o.key);
      let k = newKey();
      while (index.has(k)) k = newKey();
      o.key = k;
      index.set(k, o);
    }
  }
  const s = now() - t0;
  updSecs += s;
  console.log(`objects: pass${p} updates=${n} secs=${s.toFixed(3)}`);
}

// FNV-1a over 32-bit words, two lanes with different offsets.
let h1 = 0x811c9dc5, h2 = 0x050c5d1f;
function word(w) {
  h1 = Math.imul(h1 ^ (w & 0xffff), 0x01000193) >>> 0;
  h1 = Math.imul(h1 ^ (w >>> 16), 0x01000193) >>> 0;
  h2 = Math.imul(h2 ^ (w >>> 16), 0x01000193) >>> 0;
  h2 = Math.imul(h2 ^ (w & 0xffff), 0x01000193) >>> 0;
}
let o = objs[0];
let walked = 0;
let bad = '';
do {
  word(o.id);
  word(o.val);
  word(o.key);
  for (const t of o.tags) word(t);
  if (index.get(o.key) !== o) bad = `object ${o.id} is not in the Map under its key ${o.key}`;
  o = o.next;
  walked++;
} while (o !== objs[0] && walked <= n);
if (walked !== n) bad = `the links form a cycle of ${walked}, not ${n}`;
else if (index.size !== n) bad = `the Map holds ${index.size} objects, not ${n}`;
if (bad) {
  console.log(`objects: BAD ${bad}`);
  process.exit(1);
}
const hex = (v) => v.toString(16).padStart(8, '0');
console.log(`objects: OK objects=${n} checksum=${hex(h1)}${hex(h2)} updates_per_sec=${Math.round((n * passes) / updSecs)}`);
