package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"sort"
	"strings"
)

// Plot geometry, in pixels.
const (
	plotW, plotH     = 640, 360 // one panel's data area
	marginL, marginR = 90, 20
	marginT, marginB = 30, 50
	legendLine       = 14
	fontScale        = 2
)

var palette = []color.RGBA{
	{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255},
	{148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255},
	{188, 189, 34, 255}, {23, 190, 207, 255},
}

// WritePNG draws two panels into a PNG at path: median latency (us, log
// scale) and bus bandwidth (GB/s, linear) against message size (log2
// scale), one coloured line per series (backend, collective, algorithm,
// dtype, op, world), with a legend below. It uses only image/png.
func WritePNG(path string, results []Result) error {
	if len(results) == 0 {
		return fmt.Errorf("bench: no results to plot")
	}
	series := map[string][]Result{}
	var keys []string
	for _, r := range results {
		k := seriesKey(r)
		if _, ok := series[k]; !ok {
			keys = append(keys, k)
		}
		series[k] = append(series[k], r)
	}
	for _, k := range keys {
		sort.Slice(series[k], func(i, j int) bool { return series[k][i].Bytes < series[k][j].Bytes })
	}
	panelH := marginT + plotH + marginB
	width := marginL + plotW + marginR
	height := 2*panelH + len(keys)*legendLine + 20
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	fill(img, img.Bounds(), color.RGBA{255, 255, 255, 255})

	minB, maxB := results[0].Bytes, results[0].Bytes
	maxLat, minLat, maxBW := 0.0, math.Inf(1), 0.0
	for _, r := range results {
		minB, maxB = min(minB, r.Bytes), max(maxB, r.Bytes)
		if r.MedianUS > 0 {
			maxLat, minLat = math.Max(maxLat, r.MedianUS), math.Min(minLat, r.MedianUS)
		}
		maxBW = math.Max(maxBW, r.BusGBps)
	}
	x0, x1 := math.Log2(float64(max(minB, 1))), math.Log2(float64(max(maxB, 1)))
	if x1 <= x0 {
		x1 = x0 + 1
	}
	if math.IsInf(minLat, 1) {
		minLat, maxLat = 1, 10
	}
	l0, l1 := math.Floor(math.Log10(minLat)), math.Ceil(math.Log10(maxLat))
	if l1 <= l0 {
		l1 = l0 + 1
	}
	if maxBW <= 0 {
		maxBW = 1
	}
	bwTop := niceCeil(maxBW)

	type panel struct {
		top   int
		title string
		y     func(r Result) (float64, bool) // value in [0,1]
		ticks []tick
	}
	var latTicks, bwTicks []tick
	for e := l0; e <= l1; e++ {
		latTicks = append(latTicks, tick{(e - l0) / (l1 - l0), fmtNum(math.Pow(10, e))})
	}
	for i := 0; i <= 4; i++ {
		bwTicks = append(bwTicks, tick{float64(i) / 4, fmtNum(bwTop * float64(i) / 4)})
	}
	panels := []panel{
		{0, "LATENCY (US)", func(r Result) (float64, bool) {
			if r.MedianUS <= 0 {
				return 0, false
			}
			return (math.Log10(r.MedianUS) - l0) / (l1 - l0), true
		}, latTicks},
		{panelH, "BUS BANDWIDTH (GB/S)", func(r Result) (float64, bool) { return r.BusGBps / bwTop, true }, bwTicks},
	}
	black, grey := color.RGBA{0, 0, 0, 255}, color.RGBA{220, 220, 220, 255}
	for _, p := range panels {
		ox, oy := marginL, p.top+marginT // top-left of the data area
		px := func(b int64) int {
			return ox + int(math.Round((math.Log2(float64(max(b, 1)))-x0)/(x1-x0)*float64(plotW)))
		}
		py := func(v float64) int { return oy + plotH - int(math.Round(v*float64(plotH))) }
		text(img, ox, p.top+8, p.title, black)
		for _, t := range p.ticks {
			y := py(t.pos)
			line(img, ox, y, ox+plotW, y, grey)
			text(img, ox-8-textWidth(t.label), y-5, t.label, black)
		}
		for e := math.Ceil(x0); e <= math.Floor(x1); e++ {
			b := int64(math.Exp2(e))
			x := px(b)
			line(img, x, oy, x, oy+plotH, grey)
			if int(e-math.Ceil(x0))%2 == 0 {
				lbl := strings.ToUpper(FormatBytes(b))
				text(img, x-textWidth(lbl)/2, oy+plotH+8, lbl, black)
			}
		}
		line(img, ox, oy, ox, oy+plotH, black)
		line(img, ox, oy+plotH, ox+plotW, oy+plotH, black)
		text(img, ox+plotW/2-textWidth("SIZE")/2, oy+plotH+28, "SIZE", black)
		for i, k := range keys {
			c := palette[i%len(palette)]
			prevX, prevY, have := 0, 0, false
			for _, r := range series[k] {
				v, ok := p.y(r)
				if !ok {
					continue
				}
				x, y := px(r.Bytes), py(math.Max(0, math.Min(1, v)))
				fill(img, image.Rect(x-2, y-2, x+3, y+3), c)
				if have {
					line(img, prevX, prevY, x, y, c)
				}
				prevX, prevY, have = x, y, true
			}
		}
	}
	for i, k := range keys {
		y := 2*panelH + i*legendLine + 10
		c := palette[i%len(palette)]
		fill(img, image.Rect(marginL, y+3, marginL+24, y+6), c)
		text(img, marginL+32, y, strings.ToUpper(k), black)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return fmt.Errorf("bench: encode %s: %w", path, err)
	}
	return f.Close()
}

type tick struct {
	pos   float64 // 0 at the bottom, 1 at the top
	label string
}

// niceCeil rounds x up to 1, 2 or 5 times a power of ten.
func niceCeil(x float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

func fmtNum(x float64) string {
	switch {
	case x >= 1e6:
		return fmt.Sprintf("%gM", x/1e6)
	case x >= 1e3:
		return fmt.Sprintf("%gK", x/1e3)
	}
	return fmt.Sprintf("%g", x)
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

// line draws with Bresenham's algorithm, two pixels thick.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for {
		img.SetRGBA(x0, y0, c)
		img.SetRGBA(x0, y0+1, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		if e2 := 2 * e; e2 >= dy {
			e += dy
			x0 += sx
		} else {
			e += dx
			y0 += sy
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func sign(x int) int {
	switch {
	case x < 0:
		return -1
	case x > 0:
		return 1
	}
	return 0
}

// glyphs is a 3x5 pixel font: 15 characters per glyph, row by row.
var glyphs = map[rune]string{
	'A': ".#.#.#####.##.#", 'B': "##.#.###.#.###.", 'C': ".###..#..#...##", 'D': "##.#.##.##.###.",
	'E': "####..##.#..###", 'F': "####..##.#..#..", 'G': ".###..#.##.#.##", 'H': "#.##.#####.##.#",
	'I': "###.#..#..#.###", 'J': "..#..#..##.#.#.", 'K': "#.##.###.#.##.#", 'L': "#..#..#..#..###",
	'M': "#.########.##.#", 'N': "##.#.##.##.##.#", 'O': ".#.#.##.##.#.#.", 'P': "##.#.###.#..#..",
	'Q': ".#.#.##.###..##", 'R': "##.#.###.#.##.#", 'S': ".###...#...###.", 'T': "###.#..#..#..#.",
	'U': "#.##.##.##.####", 'V': "#.##.##.##.#.#.", 'W': "#.##.########.#", 'X': "#.##.#.#.#.##.#",
	'Y': "#.##.#.#..#..#.", 'Z': "###..#.#.#..###", '0': "####.##.##.####", '1': ".#.##..#..#.###",
	'2': "##...#.#.#..###", '3': "##...#.#...###.", '4': "#.##.####..#..#", '5': "####..##...###.",
	'6': ".###..####.####", '7': "###..#.#..#..#.", '8': "####.#####.####", '9': "####.####..###.",
	'.': ".............#.", '/': "..#..#.#.#..#..", '(': ".#.#..#..#...#.", ')': ".#...#..#..#.#.",
	'-': "......###......", '_': "............###", ':': "....#.....#....", ',': "..........#.#..",
}

func textWidth(s string) int { return len([]rune(s)) * 4 * fontScale }

// text draws s (upper case, digits and a little punctuation) with its top
// left corner at (x, y).
func text(img *image.RGBA, x, y int, s string, c color.RGBA) {
	for _, ch := range strings.ToUpper(s) {
		g := glyphs[ch]
		for i := 0; i < len(g); i++ {
			if g[i] != '#' {
				continue
			}
			gx, gy := x+(i%3)*fontScale, y+(i/3)*fontScale
			fill(img, image.Rect(gx, gy, gx+fontScale, gy+fontScale), c)
		}
		x += 4 * fontScale
	}
}
