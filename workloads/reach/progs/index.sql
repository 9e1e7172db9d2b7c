-- sqlite3 in memory: N rows inserted in a scrambled key order, an index built on the key, then
-- two aggregates that walk the table and the index. @N@ is replaced by the row count.
PRAGMA cache_size = -2000000;
CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v INTEGER);
WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < @N@)
  INSERT INTO t SELECT i, printf('key%010d-%s', (i * 2654435761) % @N@, hex(i * 31)), (i * 7919) % 1000003 FROM c;
CREATE INDEX tk ON t(k);
SELECT 'sqlite rows', count(*), sum(v), min(k), max(k) FROM t;
SELECT 'sqlite ordered', sum((rn % 1000003) * v) % 1000000007 FROM (SELECT v, row_number() OVER (ORDER BY k, id) AS rn FROM t);
