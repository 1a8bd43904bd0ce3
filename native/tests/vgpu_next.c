/* Prints what dlsym(RTLD_NEXT, "which") resolves to from inside libnext_a: "B" is right. */
#include <stdio.h>

const char *next_which(void);

int main(void)
{
    printf("%s\n", next_which());
    return 0;
}
