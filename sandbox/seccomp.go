package sandbox

import (
	"encoding/binary"
	"runtime"

	"golang.org/x/sys/unix"
)

// The seccomp filter every sandbox loads (bubblewrap --seccomp): the
// system calls that reach into another process of the same user are
// refused with EPERM, so that a tool cannot take over bubblewrap's init
// (pid 1 of its PID namespace, the same uid as the tool) and keep the
// sandbox alive after its call, nor read or write another process's
// memory. ptrace is allowed for PTRACE_TRACEME and PTRACE_DETACH only: a
// process may still ask to be traced by its parent (the stage starts the
// tool so) and its parent let it go; attaching to anything is refused.
// Everything else is allowed: the other limits are the namespaces', the
// mounts' and the rlimits'.
//
// On amd64 the 32-bit x86 ABI is filtered too, and the x32 ABI refused
// as a whole; a call of any other architecture is refused (ENOSYS).

// BPF of the filter: seccomp_data is {int nr; u32 arch; ...}.
const (
	seccompDataNR   = 0
	seccompDataArch = 4
	seccompDataArg0 = 16 // the low half of args[0] (little-endian machines)

	ptraceTraceme = 0
	ptraceDetach  = 17

	seccompRetAllow = 0x7fff0000
	seccompRetErrno = 0x00050000

	auditArchX86_64  = 0xc000003e
	auditArchI386    = 0x40000003
	auditArchAArch64 = 0xc00000b7
	auditArchARM     = 0x40000028

	x32SyscallBit = 0x40000000
)

// abi is an ABI's filter: its ptrace, the other calls it refuses, and
// whether it refuses the x32 ABI's calls.
type abi struct {
	arch   uint32
	ptrace uint32
	denied []uint32
	x32    bool
}

// abis returns the ABIs a process of this machine can use.
func abis() []abi {
	switch runtime.GOARCH {
	case "amd64":
		return []abi{
			{arch: auditArchX86_64, ptrace: unix.SYS_PTRACE, denied: []uint32{unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV, unix.SYS_PIDFD_GETFD}, x32: true},
			{arch: auditArchI386, ptrace: 26, denied: []uint32{347, 348, 438}}, // process_vm_readv, process_vm_writev, pidfd_getfd
		}
	case "arm64":
		return []abi{
			{arch: auditArchAArch64, ptrace: unix.SYS_PTRACE, denied: []uint32{unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV, unix.SYS_PIDFD_GETFD}},
			{arch: auditArchARM, ptrace: 26, denied: []uint32{376, 377, 438}},
		}
	}
	return nil
}

// seccompFilter is the program, built once.
var seccompFilter = seccompProgram()

// seccompProgram returns the filter as bubblewrap reads it: struct
// sock_filter entries, in the machine's byte order; nil on an architecture
// other than amd64 and arm64 (the sandbox then has no filter, and
// docs/workers.md says so).
func seccompProgram() []byte {
	type insn struct {
		code   uint16
		jt, jf uint8
		k      uint32
		// to, when set, is a jump target: a label, or "!" and a label
		// for a jump when the comparison fails.
		to string
	}
	const (
		ldW  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge  = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		retK = unix.BPF_RET | unix.BPF_K
	)
	var prog []insn
	labels := map[string]int{}
	list := abis()
	if len(list) == 0 {
		return nil // no filter this machine's ABIs are known for
	}
	for i, a := range list {
		this, next := "abi"+string(rune('0'+i)), "abi"+string(rune('0'+i+1))
		labels[this] = len(prog)
		prog = append(prog,
			insn{code: ldW, k: seccompDataArch},
			insn{code: jeq, k: a.arch, to: "!" + next}, // not this ABI: the next check
			insn{code: ldW, k: seccompDataNR})
		if a.x32 {
			prog = append(prog, insn{code: jge, k: x32SyscallBit, to: "deny"})
		}
		prog = append(prog, insn{code: jeq, k: a.ptrace, to: this + "ptrace"})
		for _, nr := range a.denied {
			prog = append(prog, insn{code: jeq, k: nr, to: "deny"})
		}
		prog = append(prog, insn{code: retK, k: seccompRetAllow})
		labels[this+"ptrace"] = len(prog)
		prog = append(prog,
			insn{code: ldW, k: seccompDataArg0},
			insn{code: jeq, k: ptraceTraceme, to: "allow"},
			insn{code: jeq, k: ptraceDetach, to: "allow"},
			insn{code: retK, k: seccompRetErrno | uint32(unix.EPERM)})
	}
	labels["abi"+string(rune('0'+len(list)))] = len(prog)
	prog = append(prog, insn{code: retK, k: seccompRetErrno | uint32(unix.ENOSYS)}) // an unknown ABI
	labels["deny"] = len(prog)
	prog = append(prog, insn{code: retK, k: seccompRetErrno | uint32(unix.EPERM)})
	labels["allow"] = len(prog)
	prog = append(prog, insn{code: retK, k: seccompRetAllow})

	out := make([]byte, 0, 8*len(prog))
	for i, in := range prog {
		switch {
		case in.to == "":
		case in.to[0] == '!': // jump when false
			in.jf = uint8(labels[in.to[1:]] - i - 1)
		default: // jump when true
			in.jt = uint8(labels[in.to] - i - 1)
		}
		out = binary.NativeEndian.AppendUint16(out, in.code)
		out = append(out, in.jt, in.jf)
		out = binary.NativeEndian.AppendUint32(out, in.k)
	}
	return out
}
