// write_plot: the SVG kiln-train leaves at the end of a run. Two panels side by side:
// loss (every step, and each epoch's mean) and accuracy per epoch (train, validation).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "tools/trainer.h"

namespace kiln::train {

namespace {

constexpr double kPanelWidth = 420, kPanelHeight = 300, kMargin = 50;

// A step of axis_ticks: m * 10^e with m in {1, 2, 5}.
struct TickStep {
  int m = 1, e = 0;
  // k steps, computed so that 3 steps of 0.2 print as 0.6.
  double times(int64_t k) const {
    return e >= 0 ? static_cast<double>(k * m) * std::pow(10.0, e) : static_cast<double>(k * m) / std::pow(10.0, -e);
  }
  // The decimals that show every multiple exactly.
  int decimals() const { return std::max(0, -e); }
};

TickStep tick_step(double low, double high, int count) {
  const double raw = (high - low) / std::max(count, 1);
  TickStep step;
  step.e = static_cast<int>(std::floor(std::log10(raw)));
  for (int m : {1, 2, 5, 10}) {
    step.m = m;
    if (step.times(1) >= raw * (1 - 1e-9)) break;
  }
  if (step.m == 10) {
    step.m = 1;
    ++step.e;
  }
  return step;
}

// Ticks of [low, high] on round values, and their labels (percentages when `percent`).
struct Axis {
  std::vector<double> ticks;
  std::vector<std::string> labels;
};

Axis axis(double low, double high, int count, bool percent, bool whole_numbers) {
  if (!std::isfinite(low)) low = 0;
  if (!std::isfinite(high) || high <= low) high = low + 1;
  TickStep step = tick_step(low, high, count);
  if (whole_numbers && step.e < 0) step = {1, 0};
  Axis a;
  const auto first = static_cast<int64_t>(std::floor(low / step.times(1) + 1e-9));
  const auto last = static_cast<int64_t>(std::ceil(high / step.times(1) - 1e-9));
  for (int64_t k = first; k <= last; ++k) {
    const double v = step.times(k);
    a.ticks.push_back(v);
    a.labels.push_back(percent ? fmt::format("{:.{}f}%", 100 * v, std::max(0, step.decimals() - 2))
                               : fmt::format("{:.{}f}", v, step.decimals()));
  }
  return a;
}

struct Panel {
  double left, top;  // of the plotting area
  Axis x_axis, y_axis;
  double x_min = x_axis.ticks.front(), x_max = x_axis.ticks.back();
  double y_min = y_axis.ticks.front(), y_max = y_axis.ticks.back();

  double x(double v) const { return left + (v - x_min) / std::max(x_max - x_min, 1e-12) * (kPanelWidth - 2 * kMargin); }
  double y(double v) const {
    return top + (kPanelHeight - 2 * kMargin) * (1 - (v - y_min) / std::max(y_max - y_min, 1e-12));
  }
};

std::string escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '&') out += "&amp;";
    else if (ch == '<') out += "&lt;";
    else if (ch == '>') out += "&gt;";
    else out += ch;
  }
  return out;
}

void axes(std::string& svg, const Panel& p, const std::string& title, const std::string& x_label) {
  const double w = kPanelWidth - 2 * kMargin, h = kPanelHeight - 2 * kMargin;
  svg += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#888"/>)", p.left, p.top, w, h);
  svg += fmt::format(R"(<text x="{}" y="{}" text-anchor="middle" font-size="14">{}</text>)", p.left + w / 2,
                     p.top - 12, escape(title));
  svg += fmt::format(R"(<text x="{}" y="{}" text-anchor="middle" font-size="12">{}</text>)", p.left + w / 2,
                     p.top + h + 36, escape(x_label));
  for (size_t i = 0; i < p.y_axis.ticks.size(); ++i) {
    const double v = p.y_axis.ticks[i];
    svg += fmt::format(R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="#ddd"/>)", p.left, p.y(v), p.left + w,
                       p.y(v));
    svg += fmt::format(R"(<text x="{}" y="{:.1f}" text-anchor="end" font-size="11">{}</text>)", p.left - 6,
                       p.y(v) + 4, p.y_axis.labels[i]);
  }
  for (size_t i = 0; i < p.x_axis.ticks.size(); ++i)
    svg += fmt::format(R"(<text x="{:.1f}" y="{}" text-anchor="middle" font-size="11">{}</text>)",
                       p.x(p.x_axis.ticks[i]), p.top + h + 16, p.x_axis.labels[i]);
}

void polyline(std::string& svg, const Panel& p, const std::vector<std::pair<double, double>>& points,
              const std::string& colour, double width, bool markers) {
  if (points.empty()) return;
  std::string coords;
  for (auto [x, y] : points) coords += fmt::format("{:.1f},{:.1f} ", p.x(x), p.y(y));
  svg += fmt::format(R"(<polyline points="{}" fill="none" stroke="{}" stroke-width="{}"/>)", coords, colour, width);
  if (markers)
    for (auto [x, y] : points)
      svg += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3.5" fill="{}"/>)", p.x(x), p.y(y), colour);
}

void legend(std::string& svg, double x, double y, const std::string& colour, const std::string& text) {
  svg += fmt::format(R"(<rect x="{}" y="{}" width="12" height="4" fill="{}"/>)", x, y - 4, colour);
  svg += fmt::format(R"(<text x="{}" y="{}" font-size="11">{}</text>)", x + 16, y, escape(text));
}

}  // namespace

std::vector<double> axis_ticks(double low, double high, int count) {
  return axis(low, high, count, false, false).ticks;
}

void write_plot(const std::filesystem::path& path, const std::vector<double>& step_losses,
                const std::vector<EpochRecord>& epochs, const std::string& title) {
  std::string svg = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif">)"
      R"(<rect width="100%" height="100%" fill="white"/>)"
      R"(<text x="{}" y="20" text-anchor="middle" font-size="15" font-weight="bold">{}</text>)",
      2 * kPanelWidth, kPanelHeight + 20, kPanelWidth, escape(title));

  // Loss against the optimizer step; an epoch's mean sits at its last step.
  double loss_max = 0;
  for (double l : step_losses)
    if (std::isfinite(l)) loss_max = std::max(loss_max, l);
  const Panel loss{kMargin, kMargin + 20,
                   axis(0, std::max<double>(static_cast<double>(step_losses.size()), 1), 5, false, true),
                   axis(0, loss_max > 0 ? loss_max : 1, 5, false, false)};
  axes(svg, loss, "loss", "optimizer step");
  std::vector<std::pair<double, double>> per_step, per_epoch;
  for (size_t i = 0; i < step_losses.size(); ++i)
    if (std::isfinite(step_losses[i])) per_step.emplace_back(static_cast<double>(i + 1), step_losses[i]);
  const double steps_per_epoch =
      epochs.empty() ? 1 : static_cast<double>(step_losses.size()) / static_cast<double>(epochs.size());
  for (size_t e = 0; e < epochs.size(); ++e)
    per_epoch.emplace_back(steps_per_epoch * static_cast<double>(e + 1), epochs[e].train_loss);
  polyline(svg, loss, per_step, "#9ecae1", 1, false);
  polyline(svg, loss, per_epoch, "#08519c", 2, true);
  legend(svg, loss.left + 8, loss.top + 14, "#9ecae1", "step");
  legend(svg, loss.left + 60, loss.top + 14, "#08519c", "epoch mean");

  // Accuracy against the epoch.
  const Panel accuracy{kPanelWidth + kMargin, kMargin + 20,
                       axis(1, std::max<double>(static_cast<double>(epochs.size()), 2), 5, false, true),
                       axis(0, 1, 5, true, false)};
  axes(svg, accuracy, "accuracy", "epoch");
  std::vector<std::pair<double, double>> train, val;
  for (const EpochRecord& e : epochs) {
    train.emplace_back(static_cast<double>(e.epoch + 1), e.train_accuracy);
    val.emplace_back(static_cast<double>(e.epoch + 1), e.val_accuracy);
  }
  polyline(svg, accuracy, train, "#08519c", 2, true);
  polyline(svg, accuracy, val, "#e6550d", 2, true);
  legend(svg, accuracy.left + 8, accuracy.top + 14, "#08519c", "train");
  legend(svg, accuracy.left + 60, accuracy.top + 14, "#e6550d", "validation");
  svg += "</svg>\n";

  const std::filesystem::path temporary = path.string() + fmt::format(".tmp-{}", ::getpid());
  {
    std::ofstream f(temporary, std::ios::trunc);
    f << svg;
    f.flush();
    KILN_CHECK(f.good(), "kiln-train: cannot write the plot {}", temporary.string());
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);
  KILN_CHECK(!ec, "kiln-train: cannot write the plot {}: {}", path.string(), ec.message());
}

}  // namespace kiln::train
