# vramlab report: gnuplot payoff.gp in this folder re-renders payoff.png
if (!exists("vl_png")) vl_png = 'payoff.png'
set terminal png size 900,480 noenhanced
set output vl_png
set title 'Cumulative wall time: no cache vs the one-time build (its encoders on the consumer) + cached epochs'
set xlabel 'epochs'
set ylabel 'seconds'
set grid
set key left top
set xrange [0:*]
plot 'payoff.dat' using 1:2 with linespoints lw 2 pt 7 title 'before (no cache)', '' using 1:3 with linespoints lw 2 pt 5 title 'disk_cache (build + epochs)', '' using 1:4 with linespoints lw 2 pt 9 title 'after (build + epochs)', '' using 1:5 with lines lw 2 dt 2 title 'disk_cache (the build as timed on this CPU + epochs)'
