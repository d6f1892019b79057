// loom-info: what this build of Loom is, what it found on this machine, and every
// configuration knob with the value in force and where that value came from.
//
//   loom-info [--json] [--knob NAME]
#include <getopt.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "base/log.h"
#include "info.h"

namespace {

void usage(FILE* out) {
  fprintf(out,
          "usage: loom-info [--json] [--knob NAME]\n"
          "  (none)      version, optional features and their runtimes, CPU ISA, network\n"
          "              interfaces, host identity and every knob (value, source, help)\n"
          "  --json      the same as one JSON object\n"
          "  --knob NAME one knob, by its Loom (LOOM_*) or NCCL (NCCL_*) name\n"
          "  --help      this text\n"
          "Exit status: 0; 1 when a knob shown has a malformed value (marked INVALID);\n"
          "2 for a usage error or an unknown knob.\n"
          "Library log lines (NCCL_DEBUG) go to stderr so that stdout stays parseable.\n");
}

int showKnob(FILE* out, const std::string& name, bool json) {
  loom::info::KnobInfo k;
  if (!loom::info::collectKnob(name, &k)) {
    fprintf(stderr, "loom-info: no knob named '%s'", name.c_str());
    std::vector<std::string> similar = loom::info::similarKnobs(name);
    for (size_t i = 0; i < similar.size(); ++i)
      fprintf(stderr, "%s%s", i == 0 ? "; did you mean " : ", ", similar[i].c_str());
    fprintf(stderr, "\n");
    return 2;
  }
  if (json) loom::info::printKnobJson(out, k);
  else loom::info::printKnobText(out, k);
  return k.valid ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  std::string knob;
  bool wantKnob = false;
  const option longOpts[] = {{"json", no_argument, nullptr, 'j'},
                             {"knob", required_argument, nullptr, 'k'},
                             {"help", no_argument, nullptr, 'h'},
                             {nullptr, 0, nullptr, 0}};
  for (int c; (c = getopt_long(argc, argv, "jk:h", longOpts, nullptr)) != -1;) {
    switch (c) {
      case 'j': json = true; break;
      case 'k': knob = optarg; wantKnob = true; break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "loom-info: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return 2;
  }
  FILE* out = loom::takeStdoutForReport();
  int rc = 0;
  try {
    if (wantKnob) {
      rc = showKnob(out, knob, json);
    } else {
      loom::info::Info info = loom::info::collect();
      if (json) loom::info::printJson(out, info);
      else loom::info::printText(out, info);
      rc = info.invalidKnobs() ? 1 : 0;
    }
  } catch (const std::exception& e) {
    fprintf(stderr, "loom-info: %s\n", e.what());
    rc = 2;
  }
  if (fflush(out) != 0 || ferror(out)) {
    perror("loom-info: writing the report");
    return 2;
  }
  return rc;
}
