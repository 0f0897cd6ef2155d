"""The one small package every KAME service shares: audio, config, gRPC
bootstrap, metrics, tracing, the Redis session store and embedded model paths."""
