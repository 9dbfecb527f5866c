# vramlab report: gnuplot payoff.gp in this folder re-renders payoff.png
if (!exists("vl_png")) vl_png = 'payoff.png'
set terminal png size 900,480 noenhanced
set output vl_png
set title 'Cumulative wall time: no cache vs the one-time build (its encoders on the consumer) + cached epochs'
set xlabel 'epochs (lines: build + n x the measured epoch time, extrapolated past epoch 2)'
set ylabel 'seconds'
set grid
set key below
set xrange [0:*]
set yrange [0:*]
set arrow from 2, graph 0 to 2, graph 1 nohead lc rgb 'black' dt 3
set label ' extrapolated from here' at 2, graph 0.97 left
plot 'payoff.dat' using 1:2 with linespoints lw 2 pt 7 title 'before (no cache)', '' using 1:3 with linespoints lw 2 pt 5 title 'disk_cache (build + epochs)', '' using 1:4 with linespoints lw 2 pt 9 title 'after (build + epochs)', '' using 1:5 with lines lw 2 dt 2 title 'disk_cache (the build as timed on this CPU + epochs)'
