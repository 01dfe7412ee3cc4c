#include "plan/plan_plot.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/units.h"
#include "plan/tensor_split.h"

namespace shardlm {

namespace {

std::string esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

struct Part {
  const char* name;
  const char* colour;
};
constexpr Part kParts[] = {{"weights", "#4e79a7"}, {"workspace", "#f28e2b"}, {"reserve", "#bab0ac"},
                           {"KV cache", "#59a14f"}, {"unused", "#ffffff"}};
constexpr const char* kStageColours[] = {"#e8eef7", "#fdf0e2", "#eaf4e7", "#f6e6ef", "#efeae3", "#e6f3f4"};

// One panel: a bar per device (budgets[d][r] lands on device d × tp × pp + r).
void panel(std::ostringstream& svg, const Plan& plan, const Layout& layout,
           const std::vector<std::vector<MemoryBudget>>& budgets, const std::string& title, double x0, double y0,
           double bar_w, double gap, double height, double max_mem) {
  const int n = plan.devices.n_devices();
  const int per = layout.ranks_per_replica();
  svg << "<text x=\"" << num(x0) << "\" y=\"" << num(y0 - 28) << "\" font-weight=\"bold\">" << esc(title) << "</text>\n";
  const double base = y0 + height;
  // Stage bands behind the bars: which devices form one TP group (one stage of one replica).
  for (int d = 0; d < layout.dp; ++d)
    for (int s = 0; s < layout.pp; ++s) {
      const int first = d * per + s * layout.tp;
      const double x = x0 + first * (bar_w + gap) - gap / 2;
      const double w = layout.tp * (bar_w + gap);
      svg << "<rect x=\"" << num(x) << "\" y=\"" << num(y0 - 18) << "\" width=\"" << num(w) << "\" height=\""
          << num(height + 80) << "\" fill=\"" << kStageColours[s % 6] << "\" stroke=\"#888\" stroke-dasharray=\"4 2\"/>\n";
      svg << "<text x=\"" << num(x + 4) << "\" y=\"" << num(y0 - 6) << "\" font-size=\"11\">replica " << d << " · stage "
          << s << " · TP group of " << layout.tp;
      if (layout.pp > 1 && !layout.pp_layer_partition.empty()) svg << " · " << layout.pp_layer_partition[static_cast<size_t>(s)] << " layers";
      svg << "</text>\n";
    }
  for (int dev = 0; dev < n; ++dev) {
    const DeviceSpec& spec = plan.devices.devices[static_cast<size_t>(dev)];
    const double x = x0 + dev * (bar_w + gap);
    const double cap_h = height * static_cast<double>(spec.memory_bytes) / max_mem;
    svg << "<rect x=\"" << num(x) << "\" y=\"" << num(base - cap_h) << "\" width=\"" << num(bar_w) << "\" height=\""
        << num(cap_h) << "\" fill=\"#fff\" stroke=\"#000\"><title>" << esc(spec.name) << ": "
        << esc(format_gib(static_cast<double>(spec.memory_bytes))) << "</title></rect>\n";
    const bool used = dev < layout.world_size();
    if (used) {
      const MemoryBudget& b = budgets[static_cast<size_t>(dev / per)][static_cast<size_t>(dev % per)];
      const double unused = static_cast<double>(std::max<int64_t>(
          0, b.memory_bytes - b.weight_bytes - b.workspace_bytes - b.reserve_bytes - b.kv_cache_bytes));
      const double parts[] = {static_cast<double>(b.weight_bytes), static_cast<double>(b.workspace_bytes),
                              static_cast<double>(b.reserve_bytes), static_cast<double>(b.kv_cache_bytes), unused};
      double y = base;
      for (int i = 0; i < 5; ++i) {
        const double h = height * parts[i] / max_mem;
        if (h <= 0) continue;
        const double top = std::max(y - h, y0 - 18);  // an over-full device runs off the top of its band
        svg << "<rect x=\"" << num(x) << "\" y=\"" << num(top) << "\" width=\"" << num(bar_w) << "\" height=\""
            << num(y - top) << "\" fill=\"" << kParts[i].colour << "\" stroke=\"#333\" stroke-width=\"0.5\"><title>"
            << kParts[i].name << ": " << esc(format_gib(parts[i])) << "</title></rect>\n";
        y = top;
      }
      const int r = dev % per;
      svg << "<text x=\"" << num(x + bar_w / 2) << "\" y=\"" << num(base + 14) << "\" font-size=\"11\" text-anchor=\"middle\">"
          << "rank " << dev << " (tp " << r % layout.tp << ", pp " << r / layout.tp << ")</text>\n";
      if (!b.fits())
        svg << "<text x=\"" << num(x + bar_w / 2) << "\" y=\"" << num(base - cap_h - 4)
            << "\" font-size=\"11\" fill=\"#c00\" text-anchor=\"middle\">does not fit</text>\n";
      svg << "<text x=\"" << num(x + bar_w / 2) << "\" y=\"" << num(base + 52) << "\" font-size=\"10\" text-anchor=\"middle\">"
          << "KV " << (b.n_kv_blocks_capacity >= kUnboundedBlocks ? std::string("local only")
                                                                  : with_commas(b.n_kv_blocks_capacity * b.block_size) + " tok")
          << "</text>\n";
    } else {
      svg << "<text x=\"" << num(x + bar_w / 2) << "\" y=\"" << num(base + 14)
          << "\" font-size=\"11\" text-anchor=\"middle\">idle</text>\n";
    }
    svg << "<text x=\"" << num(x + bar_w / 2) << "\" y=\"" << num(base + 27) << "\" font-size=\"11\" text-anchor=\"middle\">"
        << esc(spec.name) << "</text>\n";
    svg << "<text x=\"" << num(x + bar_w / 2) << "\" y=\"" << num(base + 40) << "\" font-size=\"10\" text-anchor=\"middle\">"
        << esc(format_gib(static_cast<double>(spec.memory_bytes))) << "</text>\n";
  }
}

}  // namespace

std::string plan_svg(const Plan& plan) {
  const int n = plan.devices.n_devices();
  double max_mem = 0;
  for (const auto& d : plan.devices.devices) max_mem = std::max(max_mem, static_cast<double>(d.memory_bytes));
  const double bar_w = 70, gap = 30, height = 320, top = 90;
  const double panel_w = n * (bar_w + gap) + 40;
  const LayoutEvaluation* rec = plan.recommended >= 0 ? &plan.layouts[static_cast<size_t>(plan.recommended)] : nullptr;
  // Nothing fits: draw the layout that came closest, to show by how much.
  if (!rec)
    for (const auto& e : plan.layouts)
      if (e.idle_devices == 0 && (!rec || e.headroom_bytes > rec->headroom_bytes)) rec = &e;
  const bool two = rec && rec->even.evaluated;
  const double w = std::max(640.0, (two ? 2 : 1) * panel_w + 40);
  const double h = top + height + 150;
  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(w)
      << "\" height=\"" << num(h) << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg << "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n";
  svg << "<text x=\"20\" y=\"24\" font-size=\"15\" font-weight=\"bold\">" << esc(plan.model_name) << " on "
      << esc(plan.devices.describe()) << " — " << objective_name(plan.options.objective) << "</text>\n";
  if (!rec) {
    svg << "<text x=\"20\" y=\"50\">No layout to draw.</text>\n</svg>\n";
    return svg.str();
  }
  std::string chosen = (plan.recommended >= 0 ? "Recommended: " : "Closest (does not fit): ") + rec->layout.to_string();
  if (rec->layout.pp > 1) {
    chosen += " layers";
    for (size_t i = 0; i < rec->layout.pp_layer_partition.size(); ++i)
      chosen += (i ? "/" : " ") + std::to_string(rec->layout.pp_layer_partition[i]);
  }
  chosen += str_cat(" — ", static_cast<int64_t>(rec->single_stream_tok_s + 0.5), " tok/s one stream, ",
                    with_commas(rec->kv_tokens), " KV tokens");
  panel(svg, plan, rec->layout, rec->budgets, chosen, 30, top, bar_w, gap, height, max_mem);
  if (two) {
    Layout even = rec->layout;
    even.tensor_split.clear();
    even.pp_layer_partition = rec->even.pp_layer_partition;
    std::string title = "Even split: " + even.to_string() + (rec->even.fits ? str_cat(" — ", static_cast<int64_t>(rec->even.single_stream_tok_s + 0.5),
                                                                                     " tok/s, ", with_commas(rec->even.kv_tokens), " KV tokens")
                                                                            : std::string(" — does not fit"));
    panel(svg, plan, even, rec->even.budgets, title, 30 + panel_w + 20, top, bar_w, gap, height, max_mem);
  }
  // Legend.
  double lx = 30;
  const double ly = h - 22;
  for (const Part& p : kParts) {
    svg << "<rect x=\"" << num(lx) << "\" y=\"" << num(ly - 10) << "\" width=\"12\" height=\"12\" fill=\"" << p.colour
        << "\" stroke=\"#333\"/><text x=\"" << num(lx + 16) << "\" y=\"" << num(ly) << "\">" << p.name << "</text>\n";
    lx += 100;
  }
  svg << "<text x=\"" << num(lx) << "\" y=\"" << num(ly) << "\" font-size=\"11\">bar height = device memory (GiB = 2^30 B); "
      << "dashed box = one TP group (one stage of one replica)</text>\n";
  svg << "</svg>\n";
  return svg.str();
}

void write_plan_svg(const Plan& plan, const std::string& path) {
  std::ofstream out(path, std::ios::binary);
  if (!out) fail(ErrorCode::kIo, "--plot ", path, ": cannot open the file for writing");
  out << plan_svg(plan);
  if (!out) fail(ErrorCode::kIo, "--plot ", path, ": cannot write the file");
}

}  // namespace shardlm
