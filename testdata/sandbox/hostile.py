#!/usr/bin/python3
# A tool that tries to outlive its call, as an attacker controlling its
# arguments would: it tries to take over the sandbox's init (pid 1 of its
# PID namespace, the same uid) with ptrace, and to read another process's
# memory, then leaves a double-forked daemon (a shell running a sleep of 10
# minutes, whose command line carries the marker of its arguments) and
# exits. It prints what the
# kernel answered to each attempt.
import ctypes, json, os, sys

args = json.load(sys.stdin)
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_SEIZE, PTRACE_ATTACH = 0x4206, 16

def attempt(name, rc):
    err = ctypes.get_errno()
    print(name, "ok" if rc == 0 else os.strerror(err))

attempt("seize init", libc.ptrace(PTRACE_SEIZE, 1, None, None))
attempt("attach init", libc.ptrace(PTRACE_ATTACH, 1, None, None))

class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(8)
local = iovec(ctypes.cast(buf, ctypes.c_void_p), 8)
remote = iovec(ctypes.c_void_p(0x400000), 8)
n = libc.process_vm_readv(1, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
attempt("read init's memory", 0 if n >= 0 else -1)

sys.stdout.flush()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        # the marker is the shell's $0: its command line, while it waits
        # for the sleep
        os.execv("/bin/sh", ["sh", "-c", "sleep 600; :", args["marker"]])
    os._exit(0)
os.wait()
