#!/bin/sh
# An example of a skill's script. overseer never executes it: running a
# skill's scripts is a tool's business, under approval.
set -eu
echo "deploying $1"
