// freeing: fills a mapping of MIB MiB (every page its own bytes), reads it all back, unmaps
// it, says "freed" on stdout, and waits for stdin to close: the memory it gave up should be
// given back meanwhile. Exits 1 if a page reads back wrong.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	size_t n = (argc > 1 ? strtoul(argv[1], NULL, 0) : 96) << 20;
	unsigned char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		return 2;
	}
	for (size_t i = 0; i < n; i += 4096)
		memset(p + i, (int)((i >> 12) * 7 + 1), 4096);
	for (size_t i = 0; i < n; i += 4096)
		for (size_t j = 0; j < 4096; j += 512)
			if (p[i + j] != (unsigned char)((i >> 12) * 7 + 1)) {
				fprintf(stderr, "freeing: page %zu reads back wrong\n", i >> 12);
				return 1;
			}
	munmap(p, n);
	printf("freed\n");
	fflush(stdout);
	char c;
	while (read(0, &c, 1) > 0)
		;
	return 0;
}
