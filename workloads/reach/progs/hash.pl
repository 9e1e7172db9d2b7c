# perl: an N-key hash of strings, half its keys rewritten, then `sort keys` digested: perl hash.pl N
use strict;
use warnings;
use Digest::SHA qw(sha256_hex);
my $n = shift @ARGV;
my %h;
for my $i (0 .. $n - 1) {
    my $k = ($i * 2654435761) % $n;
    $h{"key:$k"} = "value-" . ($k * 7) . "-" . ("x" x ($k % 40));
}
for (my $k = 0; $k < $n; $k += 2) { $h{"key:$k"} = reverse $h{"key:$k"} }
my $d = Digest::SHA->new(256);
$d->add($_, "=", $h{$_}, "\n") for sort keys %h;
print "perl hash n=$n sha256=", $d->hexdigest, "\n";
