#!/bin/sh
# Tries to write outside its working directory, then inside it, and reports
# each attempt as "<name> ok" or "<name> failed".
try() {
	name=$1
	shift
	if (echo escaped >"$1") 2>/dev/null; then echo "$name ok"; else echo "$name failed"; fi
}
try dotdot ../escape-dotdot
try dotdot2 ../../../../../../../../etc/escape-dotdot2
try etc /etc/toolbatch-escape
try usr /usr/toolbatch-escape
try home "$HOME/inside"
try cwd ./inside2
if [ "$(cat "$HOME/inside" 2>/dev/null)" = escaped ]; then echo "readback ok"; else echo "readback failed"; fi
