/* dropbatch: what an eviction batch's drop costs, per run, with EVENT_REMOVE on (launcher/shim/shim.c
 * drop_runs rests on this). A handler thread reads the uffd's REMOVE events (as farmem's fault
 * thread does); the main thread (the agent) drops 20 batches of 100 one-page runs, first with a
 * madvise per run, then with one process_madvise(PIDFD_SELF_THREAD, runs, MADV_DONTNEED) per batch.
 *
 *   cc -O2 -pthread -o dropbatch probes/dropbatch.c && for m in 0 1 2; do for h in 0 1; do ./dropbatch $m $h; done; done
 *
 * argv[1]: 0 = another thread of the process spins on CPU 1 (the program running), 1 = it sleeps
 * on CPU 1, 2 = no other thread; argv[2]: the handler's CPU (the agent is on CPU 0).
 * Measured on the 2-CPU VM, Linux 6.18 (2026-11-25), us per run:
 *
 *   other thread  handler CPU  madvise  process_madvise
 *   spinning      same (0)      55.8      4.9
 *   spinning      other (1)    160.5    118.5
 *   sleeping      same          20.9      4.7
 *   sleeping      other         65.8     25.7
 *   none          same          13.0      4.5
 *   none          other        252.5    132.9
 *
 * Each madvise waits for its REMOVE to be read and then flushes the TLB on every CPU the process
 * ran on (an IPI, tens of us in this VM); process_madvise still waits per run but flushes once. */
#define _GNU_SOURCE
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <pthread.h>
#include <sched.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <errno.h>
#include <fcntl.h>
#ifndef PIDFD_SELF
#define PIDFD_SELF -10000
#endif
static int uffd; static long removes;
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
static void *handler(void *a){ pin((long)a); struct uffd_msg m[64];
  for(;;){ struct pollfd p={uffd,POLLIN}; poll(&p,1,-1); long n=read(uffd,m,sizeof m); if(n>0) removes+=n/sizeof m[0]; }}
static volatile int stop; static char *mem;
static void *spinner(void *a){ pin((long)a); volatile long s=0; while(!stop){ for(int i=0;i<1000;i++) s+=mem[(i*4096)%(1<<20)]; } return 0;}
static void *sleeper(void *a){ pin((long)a); while(!stop) usleep(100); return 0;}
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
int main(int argc,char**argv){
  int mode=atoi(argv[1]); /* 0 spinner on cpu1, 1 sleeper on cpu1, 2 nothing */
  int hcpu=atoi(argv[2]);  /* handler cpu */
  size_t len=64<<20; mem=mmap(0,len,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  memset(mem,1,len);
  uffd=syscall(SYS_userfaultfd,O_CLOEXEC|O_NONBLOCK);
  struct uffdio_api api={.api=UFFD_API,.features=UFFD_FEATURE_EVENT_REMOVE}; if(ioctl(uffd,UFFDIO_API,&api)){perror("api");return 1;}
  struct uffdio_register r={.range={(unsigned long)mem,len},.mode=UFFDIO_REGISTER_MODE_MISSING}; if(ioctl(uffd,UFFDIO_REGISTER,&r)){perror("reg");return 1;}
  pthread_t h,o; pthread_create(&h,0,handler,(void*)(long)hcpu);
  if(mode==0) pthread_create(&o,0,spinner,(void*)1L); else if(mode==1) pthread_create(&o,0,sleeper,(void*)1L);
  pin(0); usleep(10000);
  int pidfd=syscall(SYS_pidfd_open,getpid(),0);
  enum{RUNS=100,BATCHES=20}; struct iovec iov[RUNS];
  for(int v=0; v<2; v++){ double t0=now(); long off=(8<<20);
    for(int b=0;b<BATCHES;b++){
      for(int i=0;i<RUNS;i++){ iov[i].iov_base=mem+off; iov[i].iov_len=4096; off+=2*4096; }
      if(v==0){ for(int i=0;i<RUNS;i++) if(madvise(iov[i].iov_base,4096,MADV_DONTNEED)) perror("madvise"); }
      else { long done=0; while(done<RUNS){ long k=syscall(SYS_process_madvise,pidfd,iov+done,RUNS-done,MADV_DONTNEED,0); if(k<0){perror("process_madvise");return 1;}
          /* k is bytes */ long pages=k/4096; done+=pages; } }
    }
    printf("mode %d handler cpu %d: %s: %.1f us per run (removes %ld)\n",mode,hcpu,v?"process_madvise":"madvise",(now()-t0)/(BATCHES*RUNS),removes);
  }
  stop=1; return 0;}
