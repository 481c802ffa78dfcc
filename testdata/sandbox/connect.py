#!/usr/bin/python3
# Reads {"port": N} and tries to open a TCP connection to 127.0.0.1:N.
import json, socket, sys
port = json.load(sys.stdin)["port"]
try:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"hello from the sandbox\n")
    s.close()
    print("connected")
except OSError as e:
    print("failed: %s" % e)
