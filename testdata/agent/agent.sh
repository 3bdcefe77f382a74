#!/bin/sh
# A scripted agent, for tests and the demo: it does what its prompt (its
# one argument) says, in the child's checkout, and reports through the
# inbox client like a coding agent would. Words in the prompt choose:
#
#   exit-early   exit after a second, without a report (its spawn fails:
#                the agent ended before it was ready)
#   exit-later   exit after four seconds (once ready), without a report
#                (its orchestrator gets a message of kind blocked)
#   stay-busy    keep working, never report (a busy agent)
#   report-later start the work after three seconds (once ready)
#   dirty        report done with an uncommitted file first (refused), then
#                commit it and report again
#   end-after-done  report done at once (nothing to commit), then exit 0:
#                a finished child
#   (otherwise)  write agent-work.txt, commit it, report done
#
# After its report it stays alive, as an interactive agent would (unless
# end-after-done).
prompt="$1"
say() { printf '%s agent: %s\n' "$(date +%T)" "$*"; }
say "prompt: $prompt"
case "$prompt" in
*exit-early*)
	sleep 1
	say "exiting early"
	exit 3
	;;
*exit-later*)
	sleep 4
	say "exiting without a report"
	exit 0
	;;
*end-after-done*)
	jailbee inbox send message --kind done --wait --text "done: $prompt"
	say "reported done (exit $?), ending"
	exit 0
	;;
*stay-busy*)
	say "working, with no end"
	exec sleep 86400
	;;
*report-later*)
	sleep 3
	;;
esac
git config user.name "Scripted Agent"
git config user.email "agent@example.com"
printf '%s\n' "$prompt" > agent-work.txt
case "$prompt" in
*dirty*)
	say "reporting done with an uncommitted file"
	jailbee inbox send message --kind done --wait --text "done (dirty): $prompt" || say "refused, as it should be"
	;;
esac
git add agent-work.txt && git commit -q -m "agent: $prompt"
say "committed $(git rev-parse --short HEAD)"
jailbee inbox send message --kind done --wait --text "done: $prompt"
say "reported done (exit $?)"
exec sleep 86400
