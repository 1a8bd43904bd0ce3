/* RTLD_NEXT probe, part B (see next_a.c). */
const char *which(void) { return "B"; }
