/* What this process holds in memory, as the kernel counts it: for the
 * summary lines a process logs at its end (a benchmark reads them). */
#ifndef PS_COMMON_PROCMEM_H
#define PS_COMMON_PROCMEM_H

/* VmRSS (resident now) and VmHWM (the most it has been) of
 * /proc/self/status, in kB, into *rss_kb and *hwm_kb (either may be NULL).
 * @return 0, or -1 when they cannot be read (no /proc): then both are 0. */
int ps_procmem_kb(long *rss_kb, long *hwm_kb);

/* The C library's heap (glibc's mallinfo2): bytes in use by allocations,
 * and bytes free but still held (resident only where touched), in kB. */
void ps_procmem_heap_kb(long *used_kb, long *free_kb);

/* Give the heap's free memory back to the kernel (malloc_trim) when it is
 * worth it: at least 4 MiB and a sixteenth of what is in use.  Memory
 * freed in the middle of the heap (a buffer outgrown, a table's map after
 * it doubled) otherwise stays resident until the process ends.  For a
 * long-lived process to call now and then (a shard: once a second).
 * @return 1 when it trimmed. */
int ps_procmem_trim(void);

#endif
