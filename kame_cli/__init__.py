"""The `kame` command line (kame_cli.main)."""

import os

# gRPC's C core logs a failed connection (a TLS handshake, say) on stderr by
# itself; a command's own one-line message says what failed and what to do.
# GRPC_VERBOSITY=INFO (or DEBUG) in the environment brings those logs back.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
