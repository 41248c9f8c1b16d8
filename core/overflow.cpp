#include <ampactor/core/overflow.h>

#include <cmath>
#include <limits>
#include <sstream>

namespace ampactor {

std::string OverflowReport::str() const {
  std::ostringstream o;
  o.precision(std::numeric_limits<float>::max_digits10);
  o << "iteration " << iteration << ", scale " << scale << ":";
  if (tensors.empty()) o << " no gradient named (this path does not attribute)";
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const OverflowTensor& t = tensors[i];
    o << (i ? "; " : " ") << t.name << " held "
      << (t.inf && t.nan ? "inf and NaN"
          : t.inf        ? "inf"
                         : "NaN");
    if (!std::isnan(t.neighbours_max))
      o << " (its neighbours' largest finite |grad| " << t.neighbours_max << ")";
  }
  for (std::size_t i = 0; i < ranks.size(); ++i)
    o << (i ? ", " : ranks.size() == 1 ? "; found by rank " : "; found by ranks ") << ranks[i];
  return o.str();
}

}  // namespace ampactor
