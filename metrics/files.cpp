// The file sinks: JSON lines and CSV, each record flushed as it is written.
#include <ampactor/metrics/metrics.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include <ampactor/core/errors.h>

namespace ampactor {

namespace {

/// One file written a line at a time; the first failed write is kept, nothing after it written.
struct LineFile {
  LineFile(const std::string& path, const char* what) : path(path) {
    f = std::fopen(path.c_str(), "w");
    if (!f)
      throw ScalerError(errc::bad_option, std::string(what) + ": cannot create " + path + ": " +
                                              std::strerror(errno));
  }
  ~LineFile() { close(); }
  void line(const std::string& s) {
    if (!f || !error.empty()) return;
    if (std::fwrite(s.data(), 1, s.size(), f) != s.size() || std::fputc('\n', f) == EOF ||
        std::fflush(f) != 0)
      error = path + ": write failed: " + std::strerror(errno);
  }
  void close() {
    if (f && std::fclose(f) != 0 && error.empty())
      error = path + ": close failed: " + std::strerror(errno);
    f = nullptr;
  }
  std::string path;
  std::FILE* f = nullptr;
  std::string error;
};

std::string number(double v) {
  if (std::isnan(v)) return {};
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + '"';
}

}  // namespace

std::string to_json_line(const IterationMetrics& m) {
  nlohmann::ordered_json j = {{"k", m.k},
                              {"wall_time", m.wall_time},
                              {"scale_used", m.scale_used},
                              {"scale", m.scale},
                              {"found_inf", m.found_inf},
                              {"skipped", m.skipped},
                              {"abandoned", m.abandoned},
                              {"backed_off", m.backed_off},
                              {"grew", m.grew},
                              {"growth_tracker", m.growth_tracker},
                              {"backoffs_in_row", m.backoffs_in_row},
                              {"collapsing", m.collapsing},
                              {"found_by", m.found_by},
                              {"overflow", m.overflow},
                              {"grad_norm", m.grad_norm},
                              {"trainer_wait_s", m.trainer_wait_s},
                              {"optimizer_step_s", m.optimizer_step_s},
                              {"iteration_s", m.iteration_s},
                              {"complete", m.complete}};
  return j.dump();  // NaN is written as null
}

std::string csv_header() {
  return "k,wall_time,scale_used,scale,found_inf,skipped,abandoned,backed_off,grew,growth_tracker,"
         "backoffs_in_row,collapsing,found_by,overflow,grad_norm,trainer_wait_s,optimizer_step_s,"
         "iteration_s,complete";
}

std::string to_csv_row(const IterationMetrics& m) {
  std::string ranks, names;
  for (std::int32_t r : m.found_by)
    ranks += (ranks.empty() ? "" : " ") + std::to_string(r);
  for (const std::string& n : m.overflow)
    names += (names.empty() ? "" : " ") + n;
  auto b = [](bool v) { return v ? "1" : "0"; };
  std::string row = std::to_string(m.k);
  for (const std::string& f :
       {number(m.wall_time), number(m.scale_used), number(m.scale), std::string(b(m.found_inf)),
        std::string(b(m.skipped)), std::string(b(m.abandoned)), std::string(b(m.backed_off)),
        std::string(b(m.grew)), std::to_string(m.growth_tracker), std::to_string(m.backoffs_in_row),
        std::string(b(m.collapsing)), csv_field(ranks), csv_field(names), number(m.grad_norm),
        number(m.trainer_wait_s), number(m.optimizer_step_s), number(m.iteration_s),
        std::string(b(m.complete))})
    row += "," + f;
  return row;
}

struct LineFileMetrics::File : LineFile {
  using LineFile::LineFile;
};

LineFileMetrics::LineFileMetrics(const std::string& path, const char* what,
                                 std::string (*line)(const IterationMetrics&),
                                 const std::string& header)
    : f_(std::make_unique<File>(path, what)), line_(line) {
  if (!header.empty()) f_->line(header);
}
LineFileMetrics::~LineFileMetrics() = default;
void LineFileMetrics::write(const IterationMetrics& m) {
  f_->line(line_(m));
}
void LineFileMetrics::close() {
  f_->close();
}
std::string LineFileMetrics::failure() const {
  return f_->error;
}

JsonlMetrics::JsonlMetrics(const std::string& path)
    : LineFileMetrics(path, "JsonlMetrics",
                      [](const IterationMetrics& m) { return to_json_line(m); }) {}

CsvMetrics::CsvMetrics(const std::string& path)
    : LineFileMetrics(path, "CsvMetrics", &to_csv_row, csv_header()) {}

}  // namespace ampactor
