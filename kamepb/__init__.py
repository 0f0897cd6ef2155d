"""Generated gRPC stubs: do not edit; run `make protos`."""
