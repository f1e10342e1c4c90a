#!/usr/bin/env python3
# profile-classes.py BINARY PROFILE: the share of a CPU profile's samples in each
# class (the Go scheduler, kernel I/O, allocation and GC by the stack; then by
# the leaf function: iop's own code, JSON, SQLite, gRPC, net/http, the rest).
import subprocess, sys, re, collections
binary, prof = sys.argv[1], sys.argv[2]
out = subprocess.run(["go","tool","pprof","-traces",binary,prof],capture_output=True,text=True).stdout
blocks = out.split("-----------+-------------------------------------------------------")
tot = collections.Counter()
def unit(v):
    m = re.match(r"([\d.]+)(ms|s|us|µs)", v)
    x=float(m.group(1)); u=m.group(2)
    return x*{"s":1,"ms":1e-3,"us":1e-6,"µs":1e-6}[u]
SCHED = re.compile(r"^runtime\.(futex|usleep|lock2|unlock2|findRunnable|schedule|runqgrab|stealWork|procyield|osyield|park_m|mcall|notesleep|notewakeup|wakep|startm|stopm|netpoll|checkTimers|runtimer|resetspinning|casgstatus|goready|ready|gopark|goexit0|execute|gogo|nanotime|nanotime1|exitsyscall.*|entersyscall.*|reentersyscall|selectgo|chansend|chanrecv|send|recv|sellock|selunlock|semacquire.*|semrelease.*|lock|unlock|runqput|globrunqget|mPark|exitsyscallfast|acquirep|releasep|handoffp|sysmon|retake)$|^internal/runtime/syscall/linux.EpollWait$|^runtime\.epollwait$|^internal/sync\.|^sync\.")
GC = re.compile(r"^runtime\.(mallocgc.*|memclrNoHeapPointers|gcDrain.*|scanobject|scanblock|greyobject|markBits.*|nextFreeFast|heapBits.*|.*HeapBits.*|mspan.*|\(\*mspan\).*|\(\*mcache\).*|\(\*mcentral\).*|\(\*mheap\).*|newobject|makeslice|growslice|gcBgMarkWorker|findObject|spanOf.*|markroot.*|scanstack|wbBuf.*|bulkBarrierPreWrite|gcWriteBarrier.*|sweepone|\(\*sweepLocked\).*|deductAssistCredit|gcAssistAlloc.*|typePointers.*|\(\*gcWork\).*|madvise|sysUnused.*|sysUsed.*|scavenge.*|\(\*pageAlloc\).*|\(\*spanInlineMarkBits\).*|tryDeferToSpanScan|memclr.*|newstack|copystack|stackalloc|stackfree|adjustframe|adjustpointers)$|^internal/runtime/gc/|^runtime\.\(\*gcBits|^runtime\.\(\*mspan\)")
for b in blocks:
    lines=[l for l in b.strip().split("\n") if l.strip()]
    if not lines: continue
    m = re.match(r"\s*([\d.]+(?:ms|s|us|µs))\s+(\S+)", lines[0])
    if not m: continue
    v = unit(m.group(1)); leaf = m.group(2)
    stack = [leaf]+[l.strip() for l in lines[1:]]
    def has(*names):
        return any(any(f == n or f.startswith(n) for n in names) for f in stack)
    if has("runtime.findRunnable", "runtime.schedule", "runtime.park_m", "runtime.stopm", "runtime.notesleep", "runtime.futexwakeup", "runtime.wakep", "runtime.sysmon", "runtime.goready", "runtime.ready", "runtime.gopark", "runtime.selectgo", "runtime.chansend", "runtime.chanrecv", "sync.(*Mutex)", "internal/sync.", "runtime.lock2", "runtime.unlock2", "runtime.futex", "runtime.entersyscall", "runtime.exitsyscall", "runtime.usleep"):
        k = "scheduler: goroutines parked and woken, locks"
    elif has("syscall.read", "syscall.write", "syscall.Read", "syscall.Write", "internal/poll.", "syscall.RawSyscall6", "internal/runtime/syscall/linux.Syscall6"):
        k = "kernel I/O (read, write)"
    elif has("runtime.mallocgc", "runtime.gcBgMarkWorker", "runtime.growslice", "runtime.newstack", "runtime.newobject", "runtime.makeslice", "runtime.gcAssistAlloc", "runtime.bgsweep", "runtime.bgscavenge", "runtime.gcStart", "runtime.markroot", "runtime.gcDrain") or GC.match(leaf):
        k = "allocation, GC, stack growth"
    elif leaf.startswith("encoding/json") or leaf.startswith("iop/internal/jsonscan"):
        k = "JSON"
    elif has("modernc.org/sqlite", "database/sql"):
        k = "SQLite (the usage ledger)"
    elif leaf.startswith("iop/"):
        k = "iop's own code"
    elif leaf.startswith("google.golang.org/grpc") or leaf.startswith("google.golang.org/protobuf") or leaf.startswith("golang.org/x/net/http2"):
        k = "gRPC, protobuf, HTTP/2 framing"
    elif leaf.startswith("net/http") or leaf.startswith("bufio") or leaf.startswith("net/textproto") or leaf.startswith("net.") or leaf.startswith("mime"):
        k = "net/http"
    else:
        k = "other (runtime, std: maps, context, time, strings)"
    tot[k]+=v
s=sum(tot.values())
print("total %.2fs" % s)
for k,v in tot.most_common():
    print("%-30s %5.1f%%" % (k, 100*v/s))
