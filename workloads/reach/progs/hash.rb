# ruby: an N-key Hash of strings built in a scrambled order, half its keys rewritten, then the
# keys sorted and digested: ruby hash.rb N
require "digest"
n = Integer(ARGV[0])
h = {}
n.times { |i| k = (i * 2654435761) % n; h["key:#{k}"] = "value-#{k * 7}-" + ("x" * (k % 40)) }
(0...n).step(2) { |k| h["key:#{k}"] = h["key:#{k}"].reverse }
d = Digest::SHA256.new
h.keys.sort.each { |k| d << k << "=" << h[k] << "\n" }
puts "ruby hash n=#{n} sha256=#{d.hexdigest}"
