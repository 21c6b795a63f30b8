"""`bash`, `bash_status`, `bash_stop`: shell commands in the working directory; a command still
running after `wait_sec` becomes a background job the model can poll or stop later."""

from __future__ import annotations

from kvserve.agent.tools.base import Args, Tool, ToolContext, integer, schema, string
from kvserve.agent.tools.jobs import Job, JobTable
from kvserve.agent.workspace import ToolError


class Shell:
    def __init__(self, ctx: ToolContext, jobs: JobTable):
        self.ctx = ctx
        self.jobs = jobs

    def bash(self, args: Args) -> str:
        command = args.text("command")
        wait_s = args.integer("wait_sec", 30, 1, 600)
        timeout_s = args.integer("timeout_sec", 3600, 1, 86400)
        job = self.jobs.start(command, timeout_s)
        return self._report(job, wait_s)

    def status(self, args: Args) -> str:
        job = self._job(args)
        return self._report(job, args.integer("wait_sec", 0, 0, 600))

    def stop(self, args: Args) -> str:
        job = self._job(args)
        outcome = self.jobs.stop(job, args.integer("grace_sec", 5, 0, 60), "stopped by bash_stop")
        return f"{outcome}\n{self._report(job, 0)}"

    def _job(self, args: Args) -> Job:
        job_id = args.integer("job", 0, 1, 1 << 31)
        job = self.jobs.get(job_id)
        if job is None:
            raise ToolError(
                f"no job {job_id}; running jobs: {[j.job_id for j in self.jobs.running()] or 'none'}"
            )
        return job

    def _report(self, job: Job, wait_s: float) -> str:
        has_ended = self.jobs.wait(job, wait_s, self.ctx.cancel)
        if not has_ended and self.ctx.cancel.is_set():
            self.jobs.stop(job, 2.0, "interrupted by the user")
        output = job.new_output()
        body = output if output else "(no new output)"
        if job.is_running:
            hint = f'\n[still running in the background; bash_status {{"job": {job.job_id}}} to check, bash_stop to stop]'
            return f"{job.status_line()}\n{body}{hint}"
        return f"{job.status_line()}\n{body}"


def bash_tools(shell: Shell) -> list[Tool]:
    job = integer("job id from bash")
    return [
        Tool(
            "bash",
            "Run a shell command (/bin/sh -c) in the working directory. Waits up to wait_sec for it; "
            "a command still running then continues in the background as a job.",
            schema(
                {
                    "command": string("the shell command"),
                    "wait_sec": integer("seconds to wait before returning (default 30, 1-600)"),
                    "timeout_sec": integer("kill it after this many seconds (default 3600)"),
                },
                ("command",),
            ),
            shell.bash,
            needs_confirmation=True,
            summary_field="command",
        ),
        Tool(
            "bash_status",
            "New output and status of a background job.",
            schema(
                {"job": job, "wait_sec": integer("wait up to this long for it to finish (default 0)")},
                ("job",),
            ),
            shell.status,
        ),
        Tool(
            "bash_stop",
            "Stop a background job: SIGTERM, then SIGKILL after grace_sec.",
            schema(
                {"job": job, "grace_sec": integer("seconds between SIGTERM and SIGKILL (default 5)")},
                ("job",),
            ),
            shell.stop,
            needs_confirmation=True,
        ),
    ]
