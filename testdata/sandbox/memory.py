#!/usr/bin/python3
# Allocates {"mb": N} MiB and touches it.
import json, sys
mb = json.load(sys.stdin)["mb"]
b = bytearray(mb << 20)
print("allocated %d MiB" % mb)
