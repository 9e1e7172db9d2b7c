-- lua 5.4: an N-entry table of small tables, shuffled by a fixed-seed generator, relinked, then
-- summed in order with 64-bit wrapping arithmetic: lua shuffle.lua N
local n = tonumber(arg[1])
local t = {}
for i = 1, n do t[i] = { id = i, name = "item" .. i, w = (i * 2654435761) % 1000003 } end
-- An LCG of our own rather than math.random, whose generator differs between Lua builds.
local x = 42
local function rnd(m) x = (x * 6364136223846793005 + 1442695040888963407); return ((x >> 33) % m) + 1 end
for i = n, 2, -1 do local j = rnd(i); t[i], t[j] = t[j], t[i] end
for i = 1, n do t[i].next = t[(i % n) + 1] end
local h = 0
local e = t[1]
for i = 1, n do h = h * 31 + e.id * 7 + e.w + #e.name; e = e.next end
print(string.format("lua shuffle n=%d checksum=%016x", n, h))
