#!/usr/bin/env bash
# Filter for `pip install -v` output (scripts/main_job.sh): passes ninja's [n/N] build lines and
# pip's "Successfully installed" line, drops everything else. pip -v indents the build tool's
# lines by two spaces, so the indentation is stripped rather than required to be absent.
exec sed -u -n -E -e 's/^[[:space:]]*(\[[0-9]+\/[0-9]+\] .*)$/\1/p' -e '/^Successfully installed/p'
