/* What this process holds in memory (see procmem.h). */
#include "common/procmem.h"

#include <malloc.h>
#include <stdio.h>
#include <string.h>

int ps_procmem_kb(long *rss_kb, long *hwm_kb) {
  long rss = 0, hwm = 0;
  int found = 0;
  FILE *f = fopen("/proc/self/status", "re");
  if (f != NULL) {
    char line[256];
    while (fgets(line, sizeof line, f) != NULL) {
      if (strncmp(line, "VmRSS:", 6) == 0 && sscanf(line + 6, "%ld", &rss) == 1)
        found |= 1;
      else if (strncmp(line, "VmHWM:", 6) == 0 && sscanf(line + 6, "%ld", &hwm) == 1)
        found |= 2;
    }
    fclose(f);
  }
  if (found != 3)
    rss = hwm = 0;
  if (rss_kb != NULL)
    *rss_kb = rss;
  if (hwm_kb != NULL)
    *hwm_kb = hwm;
  return found == 3 ? 0 : -1;
}

void ps_procmem_heap_kb(long *used_kb, long *free_kb) {
  struct mallinfo2 mi = mallinfo2();
  *used_kb = (long)((mi.uordblks + mi.hblkhd) / 1024);
  *free_kb = (long)(mi.fordblks / 1024);
}

int ps_procmem_trim(void) {
  struct mallinfo2 mi = mallinfo2();
  size_t in_use = mi.uordblks + mi.hblkhd;
  if (mi.fordblks < ((size_t)4 << 20) || mi.fordblks < in_use / 16)
    return 0;
  malloc_trim(0);
  return 1;
}
