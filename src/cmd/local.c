/* `paramserv local`: not written yet. */
#include "cmd/cmd.h"

int ps_cmd_local(int argc, char **argv) {
  (void)argc;
  (void)argv;
  ps_cmd_error("local: not implemented yet");
  return 1;
}
