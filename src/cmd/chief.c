/* `paramserv chief`: not written yet. */
#include "cmd/cmd.h"

int ps_cmd_chief(int argc, char **argv) {
  (void)argc;
  (void)argv;
  ps_cmd_error("chief: not implemented yet");
  return 1;
}
