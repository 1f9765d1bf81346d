/* `paramserv status`: not written yet. */
#include "cmd/cmd.h"

int ps_cmd_status(int argc, char **argv) {
  (void)argc;
  (void)argv;
  ps_cmd_error("status: not implemented yet");
  return 1;
}
