# vramlab report: gnuplot step_time.gp in this folder re-renders step_time.png
if (!exists("vl_png")) vl_png = 'step_time.png'
set terminal png size 900,480 noenhanced
set output vl_png
set title 'Time per target token (measured on cpu at the small scale; fp16 and nf4 emulated: converted to fp32 per GEMM)'
set style data histograms
set style fill solid 0.8 border -1
set boxwidth 0.7
set ylabel 'ms per token'
set yrange [0:*]
set xtics rotate by -30
set grid y
plot 'step_time.dat' using 2:xtic(1) notitle
