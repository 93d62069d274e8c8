/* notes: a C capability built with clang --target=wasm32-wasi against wasi-libc.
 *
 *   ledger capability add examples/capabilities/notes.c --manifest examples/capabilities/notes.toml
 *
 * `fib` is pure. `count_lines` reads data/notes.txt and `greet` writes to stdout: both need
 * handles, so with zero authority (admission) they answer -1, which is what the tests expect.
 * Once granted (dir:data:ro, stdout), `ledger capability call notes count_lines` counts lines.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

__attribute__((export_name("fib"))) long long fib(int n) {
    long long a = 0, b = 1;
    for (int i = 0; i < n; i++) {
        long long t = a + b;
        a = b;
        b = t;
    }
    return a;
}

__attribute__((export_name("count_lines"))) int count_lines(void) {
    FILE *f = fopen("data/notes.txt", "r");
    if (!f) return -1;
    int lines = 0, c;
    while ((c = fgetc(f)) != EOF)
        if (c == '\n') lines++;
    fclose(f);
    return lines;
}

/* Tries to create a file: allowed only through a read-write grant. */
__attribute__((export_name("touch"))) int touch(void) {
    FILE *f = fopen("data/touched.txt", "w");
    if (!f) return -1;
    fputs("touched\n", f);
    fclose(f);
    return 0;
}

__attribute__((export_name("greet"))) int greet(void) {
    const char *msg = "hello from wasm\n";
    return (int)write(1, msg, strlen(msg));
}
