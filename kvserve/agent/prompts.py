"""The texts the agent itself writes into the conversation."""

from __future__ import annotations

SYSTEM = """You are a coding assistant running inside kvserve agent, in the working directory {cwd}.
Use the tools to inspect and change files and to run commands; paths are relative to the working
directory. Read a file before changing it; prefer edit for small changes and write for new files.
Long commands keep running in the background as jobs: check them with bash_status.
When the task is done, answer briefly with what you did."""

COMPACTION_REQUEST = """[Internal kvserve agent context compaction request]
The conversation is about to be shortened. Write a durable task-state summary for your own later use:
what the user asked, what has been done (files read and changed, commands run and their results),
decisions made, the current state, and the next step. Record only what happened; solve nothing new,
call no tools. Write the summary only."""

SUMMARY_HEADER = "[kvserve agent compacted the earlier conversation. Task-state summary follows.]"
SUMMARY_FOOTER = "[End of the summary. The recent conversation continues verbatim below.]"

CONTINUE_ANSWER = (
    "[kvserve agent: the context was compacted while you were answering. Continue your answer "
    "exactly where it stopped, without repeating what you already wrote.]"
)

CUT_TOOL_CALL = (
    "[kvserve agent: your last tool call was cut off by the token limit and was NOT executed. "
    "Issue it again if it is still needed (split a large write into smaller edits).]"
)

INTERRUPTED = "[interrupted by the user]"
NOT_RUN = "not run: the user interrupted the turn"
