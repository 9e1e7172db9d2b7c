package main

import (
	"fmt"
	"math"
	"strings"
)

// plot draws two panels over simulated time, by hand in SVG (no plotting library in this
// module): the placement balance, and the bytes etcd is written per second; a dashed line
// marks each loss.
func plot(series, losses table, warm float64) string {
	const W, H, left, right, top, gap, panel = 900, 520, 70, 20, 30, 60, 190
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	tMax := series.f(len(series)-1, "t_s")
	x := func(t float64) float64 { return left + (W-left-right)*t/tMax }
	// from: the rows that set the scale (the balance of the first few slabs is no measure).
	draw := func(y0 float64, title, col string, scale, yMin, floor, from float64) {
		yMax := floor
		for i := range series {
			if series.f(i, "t_s") >= from {
				yMax = max(yMax, series.f(i, col)*scale)
			}
		}
		yMax = yMin + niceCeil(yMax-yMin)
		y := func(v float64) float64 { return y0 + panel - panel*(min(max(v, yMin), yMax)-yMin)/(yMax-yMin) }
		fmt.Fprintf(&b, `<text x="%d" y="%.0f" font-weight="bold">%s</text>`+"\n", left, y0-8, title)
		fmt.Fprintf(&b, `<rect x="%d" y="%.0f" width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", left, y0, W-left-right, panel)
		for i := 0; i <= 4; i++ {
			v := yMin + (yMax-yMin)*float64(i)/4
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y(v)+4, trimFloat(v))
			fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", left, W-right, y(v), y(v))
		}
		for i := range losses {
			t := losses.f(i, "at_s")
			color := "#bbb" // a single server's leave
			if strings.HasPrefix(losses[i]["kind"], "rack") {
				color = "#c33"
			}
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="%s" stroke-dasharray="4,3"><title>%s</title></line>`+"\n", x(t), x(t), y0, y0+panel, color, losses[i]["kind"])
		}
		var pts []string
		for i := range series {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(series.f(i, "t_s")), y(series.f(i, col)*scale)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="#2759a6" stroke-width="1.5" points="%s"/>`+"\n", strings.Join(pts, " "))
	}
	draw(top, "placement balance: fullest server's used pages over the mean (from the end of the warm-up)", "balance_max_over_mean", 1, 1, 1.1, warm)
	draw(top+panel+gap, "etcd: MiB written per second (keys and values); dashed: a rack lost (red), a server leaving (grey)", "etcd_bytes", 1.0/(1<<20)/series.f(0, "t_s"), 0, 0.1, 0)
	for t := 0.0; t <= tMax; t += tickStep(tMax) {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(t), top+2*panel+gap+16, trimFloat(t))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">simulated time, s</text>`+"\n", (W+left)/2, top+2*panel+gap+34)
	b.WriteString("</svg>\n")
	return b.String()
}

func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func tickStep(tMax float64) float64 {
	for _, s := range []float64{1, 2, 5, 10, 20, 30, 60, 120, 300, 600} {
		if tMax/s <= 12 {
			return s
		}
	}
	return 1200
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}
