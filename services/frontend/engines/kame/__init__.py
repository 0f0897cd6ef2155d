"""The `kame` and `moshi` front-end engines: the Moshi speech LM (from the `moshi`
package) with KAME's oracle stream, several sessions sharing one model as batch slots.

Modules: `checkpoint` (loading a checkpoint directory or Hugging Face repo),
`oracle` (the oracle embedding and the per-step oracle feed), `text` (oracle
text to tokens, agent tokens to timed words), `batch` (the synchronous batched
step shared by the engine and `kame replay`), `engine` (the asyncio engine).
"""
