"""Tools for the oracle's LLM: what a tool is (spec.py), where tools come from
(the operator's MCP servers: settings.py, mcp_toolbox.py), how the two LLM
wire formats carry them (wire.py), and KAME's timing rules for running them
on partial and final transcripts (turn.py)."""
