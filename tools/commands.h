// The `wush` subcommands; each returns the process exit code.
#pragma once

int cmd_formats(int argc, char** argv);
int cmd_eval(int argc, char** argv);
