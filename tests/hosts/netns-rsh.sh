#!/usr/bin/env bash
# Open MPI's remote shell (plm_rsh_agent) for the hosts of netns-hosts.sh: "ssh" into host
# GROUP-I is running the command there, in its namespace. The group: NETNS_RSH_GROUP.
# Usage (by mpirun): netns-rsh.sh HOST CMD...
set -uo pipefail
host=$1; shift
group=${NETNS_RSH_GROUP:?NETNS_RSH_GROUP names the group of hosts}
case $host in
  "$group"-[0-9]*) ;;
  *) echo "netns-rsh: $host is not a host of $group" >&2; exit 255 ;;
esac
# As ssh does, the words make one command line for the remote shell.
exec "$(dirname "$0")/netns-hosts.sh" exec "$group" "${host##*-}" sh -c "$*"
