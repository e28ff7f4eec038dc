"""One error type per exit code (SPEC §6.1): 2 bad input, 3 a data-quality gate failed, 1 anything else."""

from __future__ import annotations


class ReplabError(Exception):
    """Base of replab's own errors; `exit_code` is what the CLI returns."""

    exit_code = 1


class BadInput(ReplabError):
    """Bad trace, policy, scenario or argument (exit code 2).

    The message is one line naming where (file, row) and which rule was broken, so that a user can fix the
    input without reading code.
    """

    exit_code = 2

    def __init__(self, message: str, *, file: str | None = None, row: int | None = None,
                 rule: str | None = None) -> None:
        self.file, self.row, self.rule, self.reason = file, row, rule, message
        where = []
        if file is not None:
            where.append(str(file))
        if row is not None:
            where.append(f"row {row}")
        prefix = ", ".join(where)
        text = f"{prefix}: {message}" if prefix else message
        if rule:
            text += f" [rule: {rule}]"
        super().__init__(text)


class GateFailed(ReplabError):
    """A data-quality gate failed (exit code 3); the message carries the report path."""

    exit_code = 3

    def __init__(self, message: str, *, report_path: str | None = None) -> None:
        self.report_path = report_path
        super().__init__(message + (f" (report: {report_path})" if report_path else ""))
