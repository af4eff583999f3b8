// --report: a self-contained SVG of the learning curves (train loss, train accuracy, test
// accuracy against epoch), like the seed's Animator; rewritten atomically after every epoch so a
// browser can watch it. Loss uses the left axis, accuracies the right axis (0..1).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "dpt/error.h"
#include "dpt/files.h"
#include "dpt/metrics.h"

namespace dpt {

namespace {
// A "nice" tick step (1, 2 or 5 times a power of ten) for about `n` ticks over `span`.
double nice_step(double span, int n) {
  const double raw = span / n, p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}
std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", std::abs(v) < 1e-12 ? 0.0 : v);
  return b;
}
}  // namespace

void write_report_svg(const std::string& path, const std::vector<EpochMetrics>& h, int epochs,
                      const std::string& title) {
  const double W = 640, H = 400, L = 60, R = 60, T = 40, B = 50;
  const double pw = W - L - R, ph = H - T - B;
  const double xmax = std::max<double>(epochs, h.empty() ? 1 : h.back().epoch);
  double lmax = 0;
  for (const auto& m : h)
    if (std::isfinite(m.train_loss)) lmax = std::max(lmax, m.train_loss);
  const double lstep = nice_step(lmax > 0 ? lmax : 1, 5);
  const double ltop = std::max(lstep, std::ceil(lmax / lstep) * lstep);
  auto X = [&](double e) { return L + pw * e / xmax; };
  auto YL = [&](double v) { return T + ph * (1 - v / ltop); };
  auto YA = [&](double v) { return T + ph * (1 - v); };

  std::ostringstream s;
  s << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << " " << H << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << W / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">" << title
    << "</text>\n"
    << "<g class=\"axes\" stroke=\"black\" fill=\"none\">\n"
    << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << pw << "\" height=\"" << ph
    << "\"/>\n</g>\n";
  // x ticks: epochs.
  const double xstep = nice_step(xmax, std::min<int>(10, static_cast<int>(xmax)));
  s << "<g class=\"xticks\">\n";
  for (double e = 0; e <= xmax + 1e-9; e += std::max(1.0, xstep))
    s << "<line x1=\"" << X(e) << "\" y1=\"" << T + ph << "\" x2=\"" << X(e) << "\" y2=\""
      << T + ph + 5 << "\" stroke=\"black\"/><text x=\"" << X(e) << "\" y=\"" << T + ph + 18
      << "\" text-anchor=\"middle\">" << fmt(e) << "</text>\n";
  s << "</g>\n<g class=\"yticks\">\n";
  for (double v = 0; v <= ltop + 1e-9; v += lstep)
    s << "<line x1=\"" << L - 5 << "\" y1=\"" << YL(v) << "\" x2=\"" << L << "\" y2=\"" << YL(v)
      << "\" stroke=\"black\"/><text x=\"" << L - 8 << "\" y=\"" << YL(v) + 4
      << "\" text-anchor=\"end\">" << fmt(v) << "</text>\n";
  for (double v = 0; v <= 1 + 1e-9; v += 0.2)
    s << "<line x1=\"" << L + pw << "\" y1=\"" << YA(v) << "\" x2=\"" << L + pw + 5 << "\" y2=\""
      << YA(v) << "\" stroke=\"black\"/><text x=\"" << L + pw + 8 << "\" y=\"" << YA(v) + 4 << "\">"
      << fmt(v) << "</text>\n";
  s << "</g>\n"
    << "<text x=\"" << L + pw / 2 << "\" y=\"" << H - 12
    << "\" text-anchor=\"middle\">epoch</text>\n"
    << "<text transform=\"translate(16," << T + ph / 2
    << ") rotate(-90)\" text-anchor=\"middle\">train loss</text>\n"
    << "<text transform=\"translate(" << W - 14 << "," << T + ph / 2
    << ") rotate(90)\" text-anchor=\"middle\">accuracy</text>\n";
  struct Curve {
    const char* name;
    const char* color;
    const char* dash;
    double (*get)(const EpochMetrics&);
    bool loss_axis;
  } curves[] = {
      {"train loss", "#1f77b4", "", [](const EpochMetrics& m) { return m.train_loss; }, true},
      {"train acc", "#ff7f0e", "6,3", [](const EpochMetrics& m) { return m.train_acc; }, false},
      {"test acc", "#2ca02c", "2,2", [](const EpochMetrics& m) { return m.test_acc; }, false}};
  int i = 0;
  for (const auto& c : curves) {
    s << "<polyline class=\"curve\" data-name=\"" << c.name << "\" fill=\"none\" stroke=\""
      << c.color << "\" stroke-width=\"2\""
      << (*c.dash ? std::string(" stroke-dasharray=\"") + c.dash + "\"" : "") << " points=\"";
    // Epochs without the value (not evaluated: --eval-every; a non-finite loss) have no point.
    for (const auto& m : h)
      if (std::isfinite(c.get(m)))
        s << X(m.epoch) << "," << (c.loss_axis ? YL(c.get(m)) : YA(c.get(m))) << " ";
    s << "\"/>\n";
    // Legend entry.
    const double ly = T + 14 + 16 * i++;
    s << "<line x1=\"" << L + pw - 120 << "\" y1=\"" << ly << "\" x2=\"" << L + pw - 96
      << "\" y2=\"" << ly << "\" stroke=\"" << c.color << "\" stroke-width=\"2\""
      << (*c.dash ? std::string(" stroke-dasharray=\"") + c.dash + "\"" : "")
      << "/><text class=\"legend\" x=\"" << L + pw - 90 << "\" y=\"" << ly + 4 << "\">" << c.name
      << "</text>\n";
  }
  s << "</svg>\n";
  write_file_atomic(path, s.str(), "--report");
}

}  // namespace dpt
